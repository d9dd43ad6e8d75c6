"""`r-lace`: rank-k concept-subspace removal (R-LACE, Ravfogel et al. 2022; docs/definitions.md, "Methods"), with the
paper's spectral solver in place of R-LACE's minimax game: U holds the top-k eigenvectors (by
absolute eigenvalue) of the forget-minus-retain class-covariance difference, and the residual
stream at the layer is projected with I - U U^T at every position."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from kbench.methods.base import ALL_SUBSTRATES, Fitted, register_method
from kbench.methods.fitting import Activations, FitData
from kbench.methods.activation import ActivationEdit, LayerConfig


class RlaceConfig(LayerConfig):
    #: Directions removed (the public release: 4).
    rank: int = Field(4, ge=1)


def _covariance(x: torch.Tensor) -> torch.Tensor:
    centred = x.double() - x.double().mean(0)
    return centred.T @ centred / max(len(x) - 1, 1)


@register_method("r-lace", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}),
                 family="activation editing", order=70)
class RLACE(ActivationEdit):
    """Removes a rank-k subspace of the forget-vs-retain concept at one layer.

    h -> h - (h U) U^T over the rank-k spectral subspace."""

    Config = RlaceConfig
    config: RlaceConfig

    def _spectrum(self, acts: Activations) -> tuple[torch.Tensor, torch.Tensor]:
        difference = _covariance(acts.x[acts.label == 1]) - _covariance(acts.x[acts.label == 0])
        values, vectors = torch.linalg.eigh(difference)
        order = values.abs().argsort(descending=True)[: self.config.rank]
        return values[order], vectors[:, order]

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        return {"basis": self._spectrum(acts)[1].float().contiguous()}

    def load_fitted(self, fitted: Fitted) -> None:
        self._basis = fitted.tensors["basis"]

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        basis = self._basis.to(h)
        return h - (h @ basis) @ basis.T

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        return {"rank": self.config.rank, "eigenvalues": [float(v) for v in self._spectrum(acts)[0]]}
