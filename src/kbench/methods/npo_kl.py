"""`npo-kl`: NPO's forget term plus a KL retain term to the reference (the target before
unlearning), KL(reference || model) per retain answer token (docs/definitions.md, "Methods")."""

from typing import ClassVar

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.npo import NPOConfig, npo_forget_loss
from kbench.methods.unlearning import P_ONLY, WeightMethod
from kbench.methods.unlearning import StepLoss, UnlearnStep


@register_method("npo-kl", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=120)
class NPOKL(WeightMethod):
    """NPO's forget term plus a KL to the target before unlearning on retain answers."""

    Config: ClassVar[type[MethodConfig]] = NPOConfig
    config: NPOConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        return StepLoss(forget=self.forget_term(npo_forget_loss(step, self.config.beta)), retain=self.retain_kl(step))
