"""`mlp-probe`: a two-layer probe on the residual stream (hidden -> hidden/4, GELU -> 1), trained
with BCE to tell forget from retain (docs/definitions.md, "Methods"); at inference each position takes one gradient
step that lowers the forget logit, h - alpha grad_h logit(h). The gradient is the probe's
closed form, W1^T (w2 * GELU'(W1 h + b1)), so no autograd runs inside decoding."""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field

from kbench.methods.base import ALL_SUBSTRATES, Fitted, register_method
from kbench.methods.fitting import Activations, FitData
from kbench.methods.activation import ActivationEdit, LayerConfig


class MlpProbeConfig(LayerConfig):
    #: The gradient step's size.
    alpha: float = Field(1.0, gt=0)
    #: Probe training: full-batch Adam epochs, learning rate, weight decay, init seed.
    epochs: int = Field(300, ge=1)
    learning_rate: float = Field(0.001, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = 0


def _gelu_grad(z: torch.Tensor) -> torch.Tensor:
    """d/dz of the exact (erf) GELU."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


@register_method("mlp-probe", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}),
                 family="activation editing", order=60)
class MLPProbe(ActivationEdit):
    """One step down the probe's forget logit at every position."""

    Config = MlpProbeConfig
    config: MlpProbeConfig

    def _train(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.nn.Sequential, list[float]]:
        torch.manual_seed(self.config.seed)
        hidden = x.shape[1]
        probe = torch.nn.Sequential(torch.nn.Linear(hidden, hidden // 4), torch.nn.GELU(), torch.nn.Linear(hidden // 4, 1))
        optimizer = torch.optim.Adam(probe.parameters(), lr=self.config.learning_rate,
                                     weight_decay=self.config.weight_decay)
        losses = []
        with torch.enable_grad():
            for _ in range(self.config.epochs):
                optimizer.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(probe(x)[:, 0], y.float())
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return probe, losses

    def learn(self, acts: Activations) -> dict[str, torch.Tensor]:
        probe, _ = self._train(acts.x, acts.label)
        first, _, second = probe
        return {"w1": first.weight.detach().clone(), "b1": first.bias.detach().clone(),
                "w2": second.weight.detach()[0].clone(), "b2": second.bias.detach().clone()}

    def load_fitted(self, fitted: Fitted) -> None:
        self._w1, self._b1, self._w2, self._b2 = (fitted.tensors[k] for k in ("w1", "b1", "w2", "b2"))

    def logit(self, h: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = (t.to(h) for t in (self._w1, self._b1, self._w2, self._b2))
        return torch.nn.functional.gelu(h @ w1.T + b1) @ w2 + b2

    def gradient(self, h: torch.Tensor) -> torch.Tensor:
        """d logit / d h, in closed form."""
        w1, b1, w2 = (t.to(h) for t in (self._w1, self._b1, self._w2))
        return (_gelu_grad(h @ w1.T + b1) * w2) @ w1

    def edit(self, h: torch.Tensor) -> torch.Tensor:
        return h - self.config.alpha * self.gradient(h)

    def extra_diagnostics(self, data: FitData, acts: Activations, common: dict[str, Any]) -> dict[str, Any]:
        train, held = data.split(acts)
        probe, losses = self._train(acts.x[train], acts.label[train])
        with torch.no_grad():
            held_accuracy = float(((probe(acts.x[held])[:, 0] > 0).long() == acts.label[held]).float().mean())
            before = self.logit(acts.x)
            after = self.logit(self.edit(acts.x[None])[0])
        return {
            "probe_heldout_accuracy": held_accuracy,
            "probe_final_loss": losses[-1],
            "gradient_norm": float(self.gradient(acts.x).norm(dim=-1).mean()),
            "forget_logit_before": float(before.mean()),
            "forget_logit_after": float(after.mean()),
        }
