"""Memory substrates (docs/definitions.md, "Substrates and the LoRA-D control"); importing this package
registers the built-in four."""

from __future__ import annotations

from pathlib import Path

from kbench.config import AgentConfig
from kbench.corpus import FORGET_EVAL, RETAIN_EVAL, Corpus
from kbench.records import Entity
from kbench.substrates import builtin  # noqa: F401  (registration side effect)
from kbench.substrates.base import (
    Substrate,
    SubstrateError,
    SubstrateResources,
    register_substrate,
    substrate_class,
    substrate_names,
)
from kbench.substrates.records_db import RecordStore
from kbench.substrates.text_index import TextIndex, build_index


def index_entities(corpus: Corpus) -> list[Entity]:
    """What the R-text index holds: every queryable (eval-pool) entity plus the distractors."""
    ids = [*corpus.pools[FORGET_EVAL], *corpus.pools[RETAIN_EVAL], *corpus.distractor_ids]
    return [corpus.entities[eid] for eid in dict.fromkeys(ids)]


def build_substrate(
    name: str,
    corpus: Corpus,
    agent: AgentConfig,
    *,
    seed: int,
    index_dir: str | Path | None = None,
    adapter_path: str | None = None,
) -> Substrate:
    """One cell's substrate. The record database holds the same entities as the index."""
    resources = SubstrateResources(
        corpus=corpus,
        agent=agent,
        seed=seed,
        text_index=TextIndex.load(index_dir) if index_dir is not None else None,
        records=RecordStore(index_entities(corpus)),
        adapter_path=adapter_path,
    )
    return substrate_class(name)(resources)


__all__ = [
    "RecordStore",
    "Substrate",
    "SubstrateError",
    "SubstrateResources",
    "TextIndex",
    "build_index",
    "build_substrate",
    "index_entities",
    "register_substrate",
    "substrate_class",
    "substrate_names",
]
