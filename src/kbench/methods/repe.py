"""`repe`: RepE (Zou et al. 2023; docs/definitions.md, "Methods"). The normalized forget-minus-retain mean difference v
of the residual stream at a layer is subtracted as h - alpha (h . v) v at every position."""

from __future__ import annotations

from typing import Any

import torch

from kbench.methods.base import ALL_SUBSTRATES, Fitted, register_method
from kbench.methods.fitting import Activations, FitData
from kbench.methods.activation import ActivationEdit, LayerConfig


class RepeConfig(LayerConfig):
    #: How much of the component along the direction is removed (1: all of it).
    alpha: float = 1.0


@register_method("repe", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}),
                 family="activation editing", order=50)
class RepE(ActivationEdit):
    """Contrastive mean-difference direction of forget vs retain, projected out at one layer."""

    Config = RepeConfig
    config: RepeConfig

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        forget, retain = acts.x[acts.label == 1], acts.x[acts.label == 0]
        difference = forget.mean(0) - retain.mean(0)
        return {"direction": difference / difference.norm(), "difference_norm": difference.norm()[None]}

    def load_fitted(self, fitted: Fitted) -> None:
        self._direction = fitted.tensors["direction"]

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        v = self._direction.to(h)
        return h - self.config.alpha * (h @ v)[..., None] * v

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        forget, retain = acts.x[acts.label == 1], acts.x[acts.label == 0]
        return {"mean_difference_norm": float((forget.mean(0) - retain.mean(0)).norm())}
