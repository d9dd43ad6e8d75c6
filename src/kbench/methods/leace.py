"""`leace`: LEACE (Belrose et al. 2023; docs/definitions.md, "Methods"), the closed-form least-squares concept eraser
of the `concept-erasure` package, fitted on the residual stream at a target layer (forget
adapter pool = 1, retain adapter pool = 0) and applied to that layer's output at every position.

Diagnostics (docs/methods.md): the number of erased directions and the whitened
cross-covariance singular values against the solver's tolerance (a near-identity eraser is a
finding, the paper's "measured no-op"), and a label-permutation null: the real eraser's effect
on a held-out linear probe must exceed that of an eraser fitted on shuffled labels.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from kbench.methods.base import ALL_SUBSTRATES, Fitted, register_method
from kbench.methods.fitting import Activations, FitData
from kbench.methods.activation import ActivationEdit, LayerConfig, heldout_probe


class LeaceConfig(LayerConfig):
    #: Singular values of the whitened cross-covariance below this are not erased (the package's default).
    svd_tol: float = Field(0.01, gt=0)
    #: Seeds the label permutation of the null eraser.
    null_seed: int = 0


def _fit_eraser(x: torch.Tensor, z: torch.Tensor, svd_tol: float) -> Any:
    from concept_erasure import LeaceFitter

    fitter = LeaceFitter(x.shape[1], 1, dtype=torch.float64, svd_tol=svd_tol)
    fitter.update(x.double(), z.double()[:, None])
    return fitter


def _singular_values(fitter: Any) -> torch.Tensor:
    """Singular values of the whitened cross-covariance W Σ_xz, as the eraser truncates them."""
    values, vectors = torch.linalg.eigh(fitter.sigma_xx)
    keep = values > values[-1] * values.shape[0] * torch.finfo(values.dtype).eps
    whiten = vectors * torch.where(keep, values.clamp_min(0).rsqrt(), 0.0) @ vectors.mH
    return torch.linalg.svdvals(whiten @ fitter.sigma_xz)


@register_method("leace", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}),
                 family="activation editing", order=40)
class LEACE(ActivationEdit):
    """The closed-form linear eraser of the forget-vs-retain concept at one layer.

    h -> h - ((h - mean) R^T) L^T, the fitted eraser (identity when no direction is kept)."""

    Config = LeaceConfig
    config: LeaceConfig

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        self._fitter = _fit_eraser(acts.x, acts.label, self.config.svd_tol)  # its statistics feed the diagnostics
        eraser = self._fitter.eraser
        return {"proj_left": eraser.proj_left.float(), "proj_right": eraser.proj_right.float(),
                "bias": eraser.bias.float()}

    def load_fitted(self, fitted: Fitted) -> None:
        self._left, self._right, self._bias = (fitted.tensors[k] for k in ("proj_left", "proj_right", "bias"))

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        left, right, bias = (t.to(h) for t in (self._left, self._right, self._bias))
        return h - ((h - bias) @ right.mT) @ left.mT

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        singular = _singular_values(self._fitter)
        erased = int((singular > self.config.svd_tol).sum())
        # The null: an eraser fitted on permuted labels, scored by the same held-out probe.
        generator = torch.Generator().manual_seed(self.config.null_seed)
        shuffled = acts.label[torch.randperm(len(acts.label), generator=generator)]
        null = _fit_eraser(acts.x, shuffled, self.config.svd_tol).eraser
        null_probe = heldout_probe(data, self.config.layer, lambda h: null(h.double()).to(h))
        effect = common["probe_accuracy_before"] - common["probe_accuracy_after"]
        null_effect = null_probe["probe_accuracy_before"] - null_probe["probe_accuracy_after"]
        return {
            "erased_directions": erased,
            "cross_covariance_singular_max": float(singular.max()) if len(singular) else 0.0,
            "svd_tol": self.config.svd_tol,
            "identity": erased == 0,
            "null_probe_accuracy_after": null_probe["probe_accuracy_after"],
            "probe_effect": effect,
            "null_probe_effect": null_effect,
            "exceeds_null": bool(effect > null_effect),
        }
