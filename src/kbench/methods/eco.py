"""`eco`: input corruption (ECO, Liu et al. 2024; docs/definitions.md, "Methods"). A gate decides whether a query
targets the forget set; when it fires, Gaussian noise is added to the input embeddings of the
queried entity's name tokens in the prompt, at every generation of that query.

Gate: `oracle` (ground-truth forget membership, the paper's reference configuration) or
`learned` (logistic regression on MiniLM embeddings of the question, fitted on the adapter
pools; its held-out accuracy over unseen entities is in the fit diagnostics). Noise: each
corrupted token gets `strength` x (the embedding matrix's RMS entry, or 1 with
`strength_units: absolute`) x N(0, I), drawn from a
generator seeded by (seed, query id, position), so batching never changes it. A gated query
re-encodes its whole prompt at every step (`fresh_prompt`): a name that reaches the prompt
later (an observation, the agent's own earlier reply) is corrupted too, as a full re-encode
would. Generated tokens are never corrupted (they are not prompt).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from kbench.backends import Backend
from kbench.backends.hf import encode_prompt
from kbench.methods.base import ALL_SUBSTRATES, Fitted, Method, MethodConfig, register_method
from kbench.methods.fitting import FitData, name_positions
from kbench.methods.residual import embedding_edit
from kbench.records import FORGET, Query
from kbench.substrates.text_index import embed


class EcoConfig(MethodConfig):
    #: `oracle`: ground-truth forget membership; `learned`: the fitted question classifier.
    gate: Literal["oracle", "learned"] = "oracle"
    #: Noise per dimension, in `strength_units` (the default measured: docs/methods.md).
    strength: float = Field(16.0, gt=0)
    #: `embedding_rms`: multiples of the embedding matrix's RMS entry (portable across models);
    #: `absolute`: the raw per-dimension standard deviation (the public release's 100 on an 8B model).
    strength_units: Literal["embedding_rms", "absolute"] = "embedding_rms"
    #: Seeds the noise (with the query id and the token position).
    seed: int = 0
    #: Strengths the fit stage measures name-token recovery at (the calibration curve).
    calibration_grid: list[float] = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    #: Folds of the learned gate's held-out (unseen-entity) accuracy.
    gate_folds: int = Field(5, ge=2)


def _stable_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def _embedding_rms(model: Any) -> float:
    weight = model.get_input_embeddings().weight
    return float(weight.detach().float().pow(2).mean().sqrt())


@register_method("eco", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}),
                 family="input corruption", order=20)
class ECO(Method):
    """Gated noise on the queried entity's name-token input embeddings."""

    Config = EcoConfig
    config: EcoConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate_weights: tuple[np.ndarray, float] | None = None
        self._gates: dict[str, bool] = {}

    # -- fit: the learned gate and the strength calibration -------------------------------
    def fit(self, data: FitData) -> Fitted:
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import GroupKFold

        questions = [p.question for p in data.prompts]
        x = embed(questions)
        y = data.labels
        groups = [p.entity_id for p in data.prompts]
        folds = min(self.config.gate_folds, len(set(groups)))
        correct = 0
        for train, test in GroupKFold(n_splits=folds).split(x, y, groups):
            gate = LogisticRegression(max_iter=2000).fit(x[train], y[train])
            correct += int((gate.predict(x[test]) == y[test]).sum())
        gate = LogisticRegression(max_iter=2000).fit(x, y)
        recovery = self._recovery_curve(data)
        return Fitted(
            tensors={"gate_coef": torch.tensor(gate.coef_[0], dtype=torch.float32),
                     "gate_intercept": torch.tensor([gate.intercept_[0]], dtype=torch.float32)},
            diagnostics={
                "gate": self.config.gate,
                "learned_gate_heldout_accuracy": correct / len(y),
                "learned_gate_train_accuracy": float(gate.score(x, y)),
                "learned_gate_folds": folds,
                "embedding_rms": _embedding_rms(data.model),
                "name_token_recovery": recovery,
                "name_token_recovery_at_strength": recovery.get(str(self.config.strength)),
            },
        )

    def _recovery_curve(self, data: FitData) -> dict[str, float]:
        """Share of name tokens whose noised embedding is still nearest (L2) to its own token,
        per strength: where it reaches 0 the name-level signal is gone."""
        tokenizer, weight = data.tokenizer, data.model.get_input_embeddings().weight.detach().float()
        scale = self._unit(data.model)
        tokens: list[int] = []
        for prompt in data.prompts:
            ids = encode_prompt(tokenizer, prompt.conversation)
            name = data.corpus.entities[prompt.entity_id].name
            tokens += [ids[i] for i in name_positions(tokenizer, ids, name)]
        ids = torch.tensor(tokens)
        clean = weight[ids]
        generator = torch.Generator().manual_seed(self.config.seed)
        noise = torch.randn(clean.shape, generator=generator)
        norms = weight.pow(2).sum(-1)
        curve = {}
        for strength in sorted({*self.config.calibration_grid, self.config.strength}):
            noised = clean + strength * scale * noise
            distance = norms[None, :] - 2 * noised @ weight.T  # + |noised|^2, the same for every token
            curve[str(strength)] = float((distance.argmin(-1) == ids).float().mean())
        return curve

    def _unit(self, model: Any) -> float:
        """What `strength` multiplies: the embedding RMS or 1."""
        return _embedding_rms(model) if self.config.strength_units == "embedding_rms" else 1.0

    def load_fitted(self, fitted: Fitted) -> None:
        self._gate_weights = (fitted.tensors["gate_coef"].numpy(), float(fitted.tensors["gate_intercept"][0]))

    # -- the gate --------------------------------------------------------------------------
    def gate(self, query: Query) -> bool:
        """True when the query is taken to target the forget set."""
        if query.query_id not in self._gates:
            if self.config.gate == "oracle":
                fires = self.context.corpus.split_of(query.entity_id) == FORGET
            else:
                if self._gate_weights is None:
                    raise RuntimeError("the learned ECO gate needs its fitted artifact")
                coef, intercept = self._gate_weights
                fires = bool(float(embed([query.question])[0] @ coef) + intercept > 0)
            self._gates[query.query_id] = fires
        return self._gates[query.query_id]

    def fresh_prompt(self, query: Query) -> bool:
        return self.gate(query)

    # -- the hook --------------------------------------------------------------------------
    @contextmanager
    def forward_hooks(self, backend: Backend, queries: Sequence[Query]) -> Iterator[None]:
        tokenizer = backend.tokenizer
        scale = self._unit(backend.model)
        names = [self.context.corpus.entities[q.entity_id].name for q in queries]
        pad = tokenizer.pad_token_id

        def corrupt(ids: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
            if ids.shape[1] < 2:  # a decode pass feeds a generated token: never corrupted
                return embeddings
            rows = backend.batch_rows
            rows = range(ids.shape[0]) if rows is None else rows
            edited = None
            for j, i in enumerate(rows):
                if not self.gate(queries[i]):
                    continue
                row = ids[j].tolist()
                offset = next((k for k, t in enumerate(row) if t != pad), len(row))  # left padding
                for k in name_positions(tokenizer, row[offset:], names[i]):
                    generator = torch.Generator().manual_seed(_stable_seed(self.config.seed, queries[i].query_id, k))
                    noise = torch.randn(embeddings.shape[-1], generator=generator).to(embeddings)
                    if edited is None:
                        edited = embeddings.clone()
                    edited[j, offset + k] += self.config.strength * scale * noise
            return embeddings if edited is None else edited

        with embedding_edit(backend.model, corrupt):
            yield
