"""`ga`: gradient ascent (docs/definitions.md, "Methods"): maximize the answer NLL of the forget set, nothing else.

Loss: -forget_weight x mean token NLL of the forget batch (OpenUnlearning's GradAscent). No
retain term, so nothing holds the rest of the model in place.
"""

from typing import ClassVar

from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


class GAConfig(MethodConfig):
    #: Weight of the (negated) forget NLL.
    forget_weight: float = Field(1.0, ge=0)
    #: Overrides of `unlearning` keys (none declared).
    budget: dict = {}


@register_method("ga", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=90)
class GradientAscent(WeightMethod):
    """Gradient ascent on the forget answers' NLL, with no retain term."""

    Config: ClassVar[type[MethodConfig]] = GAConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        return StepLoss(forget=self.forget_term(-step.policy(FORGET_SET).mean_nll()))
