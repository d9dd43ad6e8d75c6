"""The shared base of the activation methods (LEACE, RepE, MLP-probe, R-LACE, noise): learn an
edit of the residual stream at one layer from the fit activations, apply it at every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from pydantic import Field

from kbench.backends import Backend
from kbench.methods.base import Fitted, Method, MethodConfig
from kbench.methods.fitting import Activations, FitData, probe_accuracy
from kbench.methods.residual import Edit, check_layer, mean_edit_norm, residual_edit
from kbench.records import Query


class LayerConfig(MethodConfig):
    """The section every activation edit shares: where it acts."""

    #: Decoder layer whose output (the residual stream) is edited, 0-based.
    layer: int = Field(16, ge=0)


class ActivationEdit(Method):
    """An activation method: `learn` a map from the fit activations at `config.layer`, then
    apply `edit` to that layer's output at every position of every forward pass, for every
    query alike (so rows still share prefilled prefixes). Not registered: a base class."""

    Config: ClassVar[type[MethodConfig]] = LayerConfig
    uniform_forward = True
    config: LayerConfig

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        """The tensors of the edit, from the fit activations at the method's layer."""
        raise NotImplementedError

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        """The edited residual stream; h is (rows, positions, hidden)."""
        raise NotImplementedError

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        """The method's own diagnostics; `common` holds what every activation method records."""
        return {}

    def fit(self, data: FitData) -> Fitted:
        check_layer(data.model, self.config.layer, self.name)
        acts = data.activations(self.config.layer)
        tensors = self.learn(acts)
        self.load_fitted(Fitted(tensors))
        common = {
            "layer": self.config.layer,
            "n_tokens": int(acts.x.shape[0]),
            "residual_norm": float(acts.x.norm(dim=-1).mean()),
            "edit_norm": mean_edit_norm(acts.x, self.edit),
            **heldout_probe(data, self.config.layer, self.edit),
        }
        return Fitted(tensors, {**common, **self.extra_diagnostics(data, acts, common)})

    def forward_hooks(self, backend: Backend, queries: Sequence[Query]) -> AbstractContextManager:
        check_layer(backend.model, self.config.layer, self.name)
        return residual_edit(backend.model, self.config.layer, self.edit)


def heldout_probe(data: FitData, layer: int, edit: Edit) -> dict[str, float]:
    """Held-out linear-probe accuracy of the concept (forget vs retain) at `layer` before and
    after `edit`: probes train on three fields' prompts and are scored on the fourth's."""
    acts = data.activations(layer)
    train, held = data.split(acts)
    with torch.no_grad():
        edited = edit(acts.x[None])[0]
    y = acts.label
    return {
        "probe_accuracy_before": data.heldout_accuracy(layer),
        "probe_accuracy_after": probe_accuracy(edited[train], y[train], edited[held], y[held]),
        "chance_accuracy": float(max(y[held].float().mean(), 1 - y[held].float().mean())),
    }
