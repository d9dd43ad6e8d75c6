"""`rmu`: representation misdirection (Li et al. 2024, WMDP; docs/definitions.md, "Methods"): on forget answers,
push a middle decoder layer's output toward a fixed random direction scaled by
`steering_coefficient` (MSE); on retain answers, keep that layer's output where the target
before unlearning had it (MSE to the reference, OpenUnlearning's EMBED_DIFF).

The MSE is the mean over hidden units, averaged per example over the positions that predict
its answer tokens, then over the batch (OpenUnlearning averages over the answer positions
themselves: the same positions shifted by one). The control direction is uniform in [0, 1)^d,
normalized, as the paper draws it, seeded by `seed`. Departure: a LoRA on every linear layer
is trained, not the three MLPs below the layer (OpenUnlearning's RMU trains everything too).
"""

from typing import Any, ClassVar

import torch
from pydantic import Field

from kbench.methods.base import MethodConfig, register_method
from kbench.methods.residual import check_layer
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import FORGET_SET, RETAIN_SET, Scored, StepLoss, UnlearnStep


class RMUConfig(UnlearnConfig):
    #: Decoder layer whose output is steered (0-based; OpenUnlearning: 7 of Llama's 32).
    layer: int = Field(7, ge=0)
    #: Norm of the control vector, in the layer's activation units.
    steering_coefficient: float = Field(20.0, gt=0)
    seed: int = 0


def _mse(scored: Scored, target: torch.Tensor) -> torch.Tensor:
    """Per-token mean squared error over hidden units, averaged per example, then over examples."""
    per_token = (scored.hidden - target).pow(2).mean(-1)
    return (scored.example_sum(per_token) / scored.example_lengths()).mean()


@register_method("rmu", substrates=P_ONLY, hooks=frozenset({"weights"}), family="published roster", order=160)
class RMU(WeightMethod):
    """Steers a middle layer's output on forget answers toward a random direction."""

    Config: ClassVar[type[MethodConfig]] = RMUConfig
    config: RMUConfig

    def hidden_layer(self) -> int:
        return self.config.layer

    def begin(self, model: Any, target_adapter: Any) -> None:
        check_layer(model, self.config.layer, self.name)
        hidden = model.config.hidden_size if hasattr(model, "config") else model.get_base_model().config.hidden_size
        draw = torch.rand(hidden, generator=torch.Generator().manual_seed(self.config.seed), dtype=torch.float64)
        self._control = draw / draw.norm() * self.config.steering_coefficient

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        forget = step.policy(FORGET_SET)
        steer = _mse(forget, self._control.to(forget.hidden))
        retain: torch.Tensor | float = 0.0
        if self.config.retain_weight and step.has(RETAIN_SET):
            retain = self.config.retain_weight * _mse(step.policy(RETAIN_SET), step.reference(RETAIN_SET).hidden)
        return StepLoss(forget=self.forget_term(steer), retain=retain)
