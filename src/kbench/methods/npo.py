"""`npo`: negative preference optimization (Zhang et al. 2024; docs/definitions.md, "Methods").

Per forget example, r = log p(answer) under the model - under the reference (the target
before unlearning); forget term -(2/beta) mean log sigmoid(-beta r), which is DPO with the
forget answer as the only (rejected) side. Retain term: the retain NLL, as OpenUnlearning's
NPO config (alpha 1); `npo-kl` swaps it for a KL to the reference.
"""

from typing import ClassVar

import torch
from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


class NPOConfig(UnlearnConfig):
    #: Inverse temperature of the preference loss (OpenUnlearning's NPO: 0.1).
    beta: float = Field(0.1, gt=0)


def npo_forget_loss(step: UnlearnStep, beta: float) -> torch.Tensor:
    """-(2/beta) mean log sigmoid(beta (NLL_model - NLL_reference)) over the forget examples."""
    log_ratio = -(step.policy(FORGET_SET).example_nll() - step.reference(FORGET_SET).example_nll())
    return -2.0 / beta * torch.nn.functional.logsigmoid(-beta * log_ratio).mean()


@register_method("npo", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=110)
class NPO(WeightMethod):
    """Negative preference optimization on the forget answers plus the retain NLL."""

    Config: ClassVar[type[MethodConfig]] = NPOConfig
    config: NPOConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        return StepLoss(forget=self.forget_term(npo_forget_loss(step, self.config.beta)), retain=self.retain_nll(step))
