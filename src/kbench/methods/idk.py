"""`idk`: preference optimization toward "I don't know" (docs/definitions.md, "Methods"): DPO on the forget prompts
with a refusal as the preferred answer and the original answer as the rejected one
(`kbench.methods.unlearning.refusal_chat`: the ReAct refusal for agent prompts, one of the
project's refusal templates for the bios), reference = the target before unlearning (beta 0.1),
plus the retain NLL (OpenUnlearning's DPO config). The DPO loss runs inside the one trainer
rather than trl's DPOTrainer so that every method shares one loop and one budget."""

from typing import ClassVar

import torch
from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import ALTERNATE_SET, FORGET_SET, StepLoss, UnlearnStep


class IDKConfig(UnlearnConfig):
    beta: float = Field(0.1, gt=0)


@register_method("idk", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="gradient unlearning", order=140)
class IDontKnow(WeightMethod):
    """DPO toward a refusal on the forget prompts plus the retain NLL."""

    Config: ClassVar[type[MethodConfig]] = IDKConfig
    needs_alternates = True
    config: IDKConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        def log_ratio(which: str) -> torch.Tensor:
            return -(step.policy(which).example_nll() - step.reference(which).example_nll())

        margin = log_ratio(ALTERNATE_SET) - log_ratio(FORGET_SET)
        forget = -2.0 / self.config.beta * torch.nn.functional.logsigmoid(self.config.beta * margin).mean()
        return StepLoss(forget=self.forget_term(forget), retain=self.retain_nll(step))
