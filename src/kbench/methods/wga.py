"""`wga`: weighted gradient ascent (Wang et al. 2025), the worked example of adding a published
loss (docs/methods.md): gradient ascent where each forget token's NLL is weighted by its
probability to the power beta (detached), so tokens the model no longer predicts stop
pulling; plus the retain NLL (OpenUnlearning's WGA: beta 1, alpha 1)."""

from typing import ClassVar

from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


class WGAConfig(UnlearnConfig):
    beta: float = Field(1.0, ge=0)


@register_method("wga", substrates=P_ONLY, hooks=frozenset({"weights"}), family="published roster", order=200)
class WeightedGradientAscent(WeightMethod):
    """Gradient ascent with each forget token weighted by its probability, plus the retain NLL."""

    Config: ClassVar[type[MethodConfig]] = WGAConfig
    config: WGAConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        nll = step.policy(FORGET_SET).token_nll()
        weight = (-nll).exp().detach() ** self.config.beta
        return StepLoss(forget=self.forget_term(-(weight * nll).mean()), retain=self.retain_nll(step))
