"""Recall probes: does a model with an injected adapter recall the records it learned?

Two greedy probes through the project's one decoder (`kbench.backends.hf.greedy_decode`),
scored with the observer's matcher: the direct question and the elicited summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kbench.agent.prompts import summary_conversation
from kbench.backends.hf import greedy_decode
from kbench.config import Params
from kbench.corpus import Corpus
from kbench.observer.matcher import match
from kbench.parametric.injection import ASSISTANT_SYSTEM, FORGET_ADAPTER_POOL, adapter_pool, queried_entities
from kbench.records import FIELDS, FORGET, RETAIN, Entity, Query

#: New tokens of a direct-probe answer: one sentence ("{name}'s {field} is {value}.") fits in
#: about 30, so a longer cap only lets a rambling reply cost time.
DIRECT_PROBE_TOKENS = 48


def _direct_hits(model: Any, tokenizer: Any, entities: Sequence[Entity], *, batch_size: int,
                 max_new_tokens: int = DIRECT_PROBE_TOKENS) -> list[bool]:
    """Per (entity, field), entity-major: does the greedy answer to the canonical question hold the value?"""
    queries = [Query.canonical(e, f) for e in entities for f in FIELDS]
    chats = [
        [{"role": "system", "content": ASSISTANT_SYSTEM}, {"role": "user", "content": q.question}] for q in queries
    ]
    replies = greedy_decode(model, tokenizer, chats, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [match(q.field, q.ground_truth, r).leaked for q, r in zip(queries, replies)]


def _summary_hits(model: Any, tokenizer: Any, entities: Sequence[Entity], *, max_new_tokens: int,
                  batch_size: int) -> list[bool]:
    """Per (entity, field), entity-major: does the elicited summary (the prompt of
    docs/definitions.md, "The trace record") state the value?"""
    chats = [summary_conversation(e.name, []) for e in entities]
    replies = greedy_decode(model, tokenizer, chats, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [match(f, e.value(f), r).leaked for e, r in zip(entities, replies) for f in FIELDS]


def direct_recall(model: Any, tokenizer: Any, entities: Sequence[Entity], *, batch_size: int,
                  max_new_tokens: int = DIRECT_PROBE_TOKENS) -> float:
    """Fraction of (entity, field) whose greedy answer to the canonical question holds the value."""
    hits = _direct_hits(model, tokenizer, entities, batch_size=batch_size, max_new_tokens=max_new_tokens)
    return sum(hits) / len(hits)


def summary_recall(model: Any, tokenizer: Any, entities: Sequence[Entity], *, max_new_tokens: int,
                   batch_size: int) -> float:
    """Fraction of (entity, field) whose value the elicited summary (the prompt of
    docs/definitions.md, "The trace record") states."""
    hits = _summary_hits(model, tokenizer, entities, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return sum(hits) / len(hits)


def recall_metrics(model: Any, tokenizer: Any, groups: dict[str, Sequence[Entity]], params: Params) -> dict[str, float]:
    """Direct and summary recall of each non-empty entity group, as `<probe>_recall.<group>`.

    Each probe decodes every group's prompts in one call (full batches across groups), then
    scores each group on its own share of the replies.
    """
    batch_size = params.injection.recall_batch_size
    named = {name: list(entities) for name, entities in groups.items() if entities}
    everyone = [e for entities in named.values() for e in entities]
    if not everyone:
        return {}
    hits = {
        "direct_recall": _direct_hits(model, tokenizer, everyone, batch_size=batch_size),
        "summary_recall": _summary_hits(model, tokenizer, everyone, max_new_tokens=params.agent.summary_max_new_tokens,
                                        batch_size=batch_size),
    }
    metrics = {}
    start = 0
    for name, entities in named.items():
        stop = start + len(entities) * len(FIELDS)
        for probe, probe_hits in hits.items():
            metrics[f"{probe}.{name}"] = sum(probe_hits[start:stop]) / (stop - start)
        start = stop
    return metrics


def probe_groups(corpus: Corpus, params: Params) -> dict[str, list[Entity]]:
    """Entity groups every adapter is probed on: what it should recall and what it must not."""
    queried = queried_entities(corpus, params)
    ids = {
        FORGET_ADAPTER_POOL: adapter_pool(corpus, params, FORGET_ADAPTER_POOL),
        "forget_queried": queried[FORGET],
        "retain_queried": queried[RETAIN],
    }
    return {name: [corpus.entities[e] for e in group] for name, group in ids.items()}
