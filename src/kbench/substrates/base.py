"""The substrate interface and its registry (docs/definitions.md, "Substrates and the LoRA-D control").

A substrate decides where the target's record lives in one cell. The harness asks it three
things per query: which bios go in the system prompt, which documents `search_wiki` may
return and which records `lookup_record`/`verify_attribute` may read; and, once per cell,
which LoRA adapter to load. Every store also serves the distractors, so the agent sees the
same distractor context and retrieval sets in every cell (§4.1) and only the target moves.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from kbench.config import AgentConfig
from kbench.corpus import Corpus
from kbench.records import Entity, Query
from kbench.registry import Registry
from kbench.substrates.records_db import RecordStore
from kbench.substrates.text_index import TextIndex


class SubstrateError(ValueError):
    """A substrate is unknown or lacks what it needs (an index, an adapter)."""


@dataclass(frozen=True)
class SubstrateResources:
    corpus: Corpus
    agent: AgentConfig
    seed: int
    #: The R-text index; the other substrates use it for its distractor passages.
    text_index: TextIndex | None
    records: RecordStore
    #: P: the LoRA-T+D adapter. Any other substrate: the LoRA-D control adapter, or None.
    adapter_path: str | None = None


class Substrate:
    name: ClassVar[str]

    def __init__(self, resources: SubstrateResources) -> None:
        self.resources = resources
        self.distractors = frozenset(resources.corpus.distractor_ids)

    @property
    def text_index(self) -> TextIndex | None:
        return self.resources.text_index

    @property
    def records(self) -> RecordStore:
        return self.resources.records

    def background(self, query: Query) -> list[Entity]:
        """Bios placed in the system prompt for this query."""
        return []

    def searchable(self, query: Query) -> frozenset[str] | None:
        """Doc ids `search_wiki` may return (None: all)."""
        return self.distractors

    def readable(self, query: Query) -> frozenset[str] | None:
        """Record ids the record tools may read (None: all)."""
        return self.distractors

    @property
    def adapter_path(self) -> str | None:
        return self.resources.adapter_path

    def distractor_sample(self, query: Query) -> list[Entity]:
        """k distractor bios for this query, the same for a (seed, query) in every cell."""
        rng = random.Random(f"{self.resources.seed}:{query.query_id}")
        pool = sorted(self.distractors - {query.entity_id})
        picked = rng.sample(pool, min(self.resources.agent.k_distractors, len(pool)))
        return [self.resources.corpus.entities[eid] for eid in picked]


_SUBSTRATES: Registry[type[Substrate]] = Registry("substrate", SubstrateError)


def register_substrate(name: str) -> Callable[[type[Substrate]], type[Substrate]]:
    def decorate(cls: type[Substrate]) -> type[Substrate]:
        cls.name = name
        return _SUBSTRATES.add(name, cls)

    return decorate


def substrate_names() -> list[str]:
    return _SUBSTRATES.names()


def substrate_class(name: str) -> type[Substrate]:
    return _SUBSTRATES.get(name)
