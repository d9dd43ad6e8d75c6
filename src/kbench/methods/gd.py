"""`gd`: gradient difference (docs/definitions.md, "Methods"): gradient ascent on the forget set plus ordinary
training (NLL) on the retain set (OpenUnlearning's GradDiff, retain_loss_type NLL)."""

from kbench.methods.base import register_method
from kbench.methods.unlearning import P_ONLY, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


@register_method("gd", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=100)
class GradientDifference(WeightMethod):
    """Gradient ascent on the forget answers plus the retain NLL."""

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        return StepLoss(forget=self.forget_term(-step.policy(FORGET_SET).mean_nll()), retain=self.retain_nll(step))
