"""`gold`: the retain-only reference (docs/definitions.md, "Methods"), scored like a method on substrate P.

The gold model is the agent with an adapter trained by the LoRA-T+D recipe on the retain
entities alone; it never saw a forget entity, so it marks what a successful unlearning should
resemble. The method itself uses no hook: what makes a cell `gold` is the adapter it loads,
and the cell stage refuses any adapter but the gold one for it (kbench.parametric.adapters).
"""

from kbench.methods.base import Method, register_method
from kbench.names import GOLD_METHOD, PARAMETRIC


@register_method(GOLD_METHOD, substrates=frozenset({PARAMETRIC}), family="reference", order=10)
class GoldReference(Method):
    """The retain-only adapter in place of LoRA-T+D; nothing else changes."""
