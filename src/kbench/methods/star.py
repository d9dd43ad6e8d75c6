"""`star`: reasoning-trace filtering (StaR, Zhou et al. 2026; docs/definitions.md, "Methods"), with the paper's
detector: a sentence of generated thought text is redacted when its MiniLM embedding is
within a cosine threshold of a protected entity's description (the forget set's bios).

It acts on generated text only, after generation and before parsing: every line but the
`Action:` and `Final Answer:` lines is thought, sentence by sentence, and the elicited
summary (which has no ReAct lines) is all thought. What a tool returns is never touched, so
on R-struct the value still reaches the agent through the observation: the paper's K-SUP case.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from pydantic import Field

from kbench.methods.base import ALL_SUBSTRATES, Fitted, Method, MethodConfig, register_method
from kbench.methods.fitting import FitData
from kbench.records import FORGET, Query
from kbench.substrates.text_index import embed

#: Lines StaR never edits: the action the harness runs and the final answer.
_KEPT_LINE = re.compile(r"^\s*(Action|Action Input|Final Answer)\s*:", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
REDACTED = "[redacted]"


class StarConfig(MethodConfig):
    #: A thought sentence at or above this cosine to a protected description is redacted
    #: (chosen from the fit stage's calibration: docs/methods.md).
    threshold: float = Field(0.55, ge=-1, le=1)


def sentences(line: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(line) if s]


@register_method("star", substrates=ALL_SUBSTRATES, hooks=frozenset({"output"}),
                 family="reasoning-trace filtering", order=30)
class StaR(Method):
    """Redacts thought sentences close to a forget entity's description."""

    Config = StarConfig
    config: StarConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protected: np.ndarray | None = None

    @property
    def protected(self) -> np.ndarray:
        """Unit MiniLM embeddings of every forget entity's description (the unlearning request)."""
        if self._protected is None:
            corpus = self.context.corpus
            bios = [e.bio for eid, e in sorted(corpus.entities.items()) if corpus.split_of(eid) == FORGET]
            self._protected = embed(bios)
        return self._protected

    def redact_line(self, line: str) -> str:
        parts = sentences(line)
        if not parts:
            return line
        scores = (embed(parts) @ self.protected.T).max(-1)
        kept = [REDACTED if score >= self.config.threshold else part for part, score in zip(parts, scores)]
        return " ".join(kept) if kept != parts else line

    def filter_output(self, query: Query, text: str) -> str:
        lines = text.split("\n")
        return "\n".join(line if _KEPT_LINE.match(line) or not line.strip() else self.redact_line(line)
                         for line in lines)

    def fit(self, data: FitData) -> Fitted:
        """Calibration only (nothing is learned): how the threshold separates thought-like
        sentences about protected (forget-adapter) entities from ones about retain-adapter
        entities, with the forget-adapter bios as the protected set."""
        from sklearn.metrics import roc_auc_score

        corpus = data.corpus
        protected = embed([corpus.entities[eid].bio for eid in corpus.pools["forget_adapter"]])
        texts = [f"I need to find {corpus.entities[p.entity_id].name}'s {p.field.replace('_', ' ')}." for p in data.prompts]
        texts += [p.question for p in data.prompts]
        labels = np.concatenate([data.labels, data.labels])
        scores = (embed(texts) @ protected.T).max(-1)
        flagged = scores >= self.config.threshold
        best = max(np.unique(scores), key=lambda t: (scores[labels == 1] >= t).mean() - (scores[labels == 0] >= t).mean())
        return Fitted(diagnostics={
            "threshold": self.config.threshold,
            "auc": float(roc_auc_score(labels, scores)),
            "true_positive_rate": float(flagged[labels == 1].mean()),
            "false_positive_rate": float(flagged[labels == 0].mean()),
            "youden_threshold": float(best),
            "score_mean_protected": float(scores[labels == 1].mean()),
            "score_mean_other": float(scores[labels == 0].mean()),
        })
