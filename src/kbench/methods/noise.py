"""`noise`: the activation control (docs/definitions.md, "Methods"). A seeded random unit direction u is added at the
same layer as the activation methods, h + c u at every position, with c the mean per-token
edit norm those methods apply on the fit prompts (measured in the fit stage and stored). It
separates "perturbing activations" from "erasing a direction"."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from kbench.methods.base import (
    ALL_SUBSTRATES, Fitted, MethodContext, all_methods, build_method, method_class, register_method,
)
from kbench.methods.fitting import Activations, FitData
from kbench.methods.activation import ActivationEdit, LayerConfig
from kbench.methods.residual import check_layer, mean_edit_norm


def activation_methods() -> list[str]:
    """Every registered activation method but noise itself, in the order of `methods: all`
    (the built-in ones: leace, repe, mlp-probe, r-lace)."""
    return [name for name in all_methods()
            if issubclass(method_class(name), ActivationEdit) and not issubclass(method_class(name), Noise)]


class NoiseConfig(LayerConfig):
    #: The activation methods whose mean edit norm c matches (each measured at its own layer);
    #: by default every registered one.
    matched_to: list[str] = Field(default_factory=activation_methods, min_length=1)
    #: Seeds the direction.
    seed: int = 0


@register_method("noise", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}), family="control", order=80)
class Noise(ActivationEdit):
    """A random direction of the activation methods' mean edit norm."""

    Config = NoiseConfig
    config: NoiseConfig

    def _matched_norms(self, data: FitData) -> dict[str, float]:
        norms = {}
        for name in self.config.matched_to:
            method = build_method(name, MethodContext(data.corpus, data.params, 0))
            if not isinstance(method, ActivationEdit):
                raise ValueError(f"method_params.noise.matched_to: {name!r} is not an activation method")
            check_layer(data.model, method.config.layer, name)
            acts = data.activations(method.config.layer)
            method.load_fitted(Fitted(method.learn(acts)))
            norms[name] = mean_edit_norm(acts.x, method.edit)
        return norms

    def fit(self, data: FitData) -> Fitted:
        self._norms = self._matched_norms(data)
        return super().fit(data)

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.config.seed)
        direction = torch.randn(acts.x.shape[1], generator=generator, dtype=torch.float64)
        scale = sum(self._norms.values()) / len(self._norms)
        return {"direction": (direction / direction.norm()).float(), "scale": torch.tensor([scale])}

    def load_fitted(self, fitted: Fitted) -> None:
        self._shift = fitted.tensors["direction"] * fitted.tensors["scale"][0]

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        return h + self._shift.to(h)

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        return {"matched_edit_norms": self._norms, "scale": sum(self._norms.values()) / len(self._norms)}
