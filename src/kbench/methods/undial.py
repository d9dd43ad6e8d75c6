"""`undial`: self-distillation with adjusted logits (Dong et al. 2024), the second worked
example of adding a loss (docs/methods.md): the model is distilled on the forget answers
toward the reference's distribution with the true token's logit lowered by beta; no retain
term by default, as the paper and OpenUnlearning's config (alpha 0, beta 10).

Departure: the distillation is averaged over the forget answer tokens only (OpenUnlearning
averages over every position of the padded batch)."""

from typing import ClassVar

import torch
from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import FORGET_SET, StepLoss, UnlearnStep


class UNDIALConfig(UnlearnConfig):
    retain_weight: float = Field(0.0, ge=0)
    #: How far the true token's logit is lowered in the teacher.
    beta: float = Field(10.0, ge=0)


@register_method("undial", substrates=P_ONLY, hooks=frozenset({"weights"}),
                 family="published roster", order=210)
class UNDIAL(WeightMethod):
    """Self-distillation toward the reference with the true token's logit lowered."""

    Config: ClassVar[type[MethodConfig]] = UNDIALConfig
    config: UNDIALConfig

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        policy, reference = step.policy(FORGET_SET), step.reference(FORGET_SET)
        teacher = reference.logits.scatter_add(
            -1, reference.targets[:, None],
            torch.full_like(reference.logits[:, :1], -self.config.beta),
        )
        soft = torch.softmax(teacher, -1)
        forget = -(soft * torch.log_softmax(policy.logits, -1)).sum(-1).mean()
        return StepLoss(forget=self.forget_term(forget), retain=self.retain_nll(step))
