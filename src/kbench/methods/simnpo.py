"""`simnpo`: simple NPO (Fan et al. 2024), reference-free: the forget term is
-(2/beta) mean log sigmoid(beta (NLL / length - delta)) over the forget examples, weighted by
gamma; plus the retain NLL (OpenUnlearning's SimNPO: beta 4.5, gamma 0.125, delta 0, alpha 1)."""

from typing import ClassVar

import torch
from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


class SimNPOConfig(UnlearnConfig):
    forget_weight: float = Field(0.125, ge=0)   # OpenUnlearning's gamma
    beta: float = Field(4.5, gt=0)
    #: The reward margin subtracted from the length-normalized NLL.
    delta: float = 0.0


@register_method("simnpo", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="published roster", order=130)
class SimNPO(WeightMethod):
    """Reference-free NPO on length-normalized forget NLL plus the retain NLL."""

    Config: ClassVar[type[MethodConfig]] = SimNPOConfig
    config: SimNPOConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        scored = step.policy(FORGET_SET)
        normalized = scored.example_nll() / scored.example_lengths() - self.config.delta
        beta = self.config.beta
        forget = -2.0 / beta * torch.nn.functional.logsigmoid(beta * normalized).mean()
        return StepLoss(forget=self.forget_term(forget), retain=self.retain_nll(step))
