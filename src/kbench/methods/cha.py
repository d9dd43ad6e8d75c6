"""`cha`: LoKU (Cha et al. 2024): the inverted hinge loss on the forget answers plus the
retain NLL, trained on the existing LoRA weights without the Fisher-information
initialisation, as the paper runs it (docs/definitions.md, "Methods").

Inverted hinge per forget token: 1 + p(true token) - max over other tokens p(token), which
pushes the true token below its strongest rival instead of pushing it to zero probability.
"""

import torch

from kbench.methods.base import register_method
from kbench.methods.unlearning import P_ONLY, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


def inverted_hinge(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(tokens,) 1 + p(target) - max_{v != target} p(v)."""
    probs = torch.softmax(logits, -1)
    true = probs.gather(-1, targets[:, None])[:, 0]
    rival = probs.scatter(-1, targets[:, None], float("-inf")).max(-1).values
    return 1.0 + true - rival


@register_method("cha", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=150)
class LoKU(WeightMethod):
    """LoKU's inverted hinge loss on the forget answers plus the retain NLL."""

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        scored = step.policy(FORGET_SET)
        forget = inverted_hinge(scored.logits, scored.targets).mean()
        return StepLoss(forget=self.forget_term(forget), retain=self.retain_nll(step))
