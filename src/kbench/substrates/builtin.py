"""The four substrates (docs/definitions.md, "Substrates and the LoRA-D control"): P, C, R-text, R-struct."""

from __future__ import annotations

import random

from kbench.names import CONTEXT, PARAMETRIC, STRUCT_RETRIEVAL, TEXT_RETRIEVAL
from kbench.records import Entity, Query
from kbench.substrates.base import Substrate, SubstrateError, SubstrateResources, register_substrate


@register_substrate(CONTEXT)
class ContextSubstrate(Substrate):
    """The target's bio verbatim in the system prompt beside k distractor bios, in seeded order."""

    def background(self, query: Query) -> list[Entity]:
        bios = [self.resources.corpus.entities[query.entity_id], *self.distractor_sample(query)]
        random.Random(f"{self.resources.seed}:{query.query_id}:order").shuffle(bios)
        return bios


@register_substrate(TEXT_RETRIEVAL)
class TextRetrievalSubstrate(Substrate):
    """The target's bio is a passage in the vector index that `search_wiki` searches."""

    def __init__(self, resources: SubstrateResources) -> None:
        if resources.text_index is None:
            raise SubstrateError(f"substrate {TEXT_RETRIEVAL} needs the FAISS index (see build_index)")
        super().__init__(resources)

    def searchable(self, query: Query) -> frozenset[str] | None:
        return None


@register_substrate(STRUCT_RETRIEVAL)
class StructuredRetrievalSubstrate(Substrate):
    """The target's record is a row of the database behind `lookup_record`/`verify_attribute`."""

    def readable(self, query: Query) -> frozenset[str] | None:
        return None


@register_substrate(PARAMETRIC)
class ParametricSubstrate(Substrate):
    """The target lives in a LoRA adapter (LoRA-T+D) loaded onto the agent's weights."""

    def __init__(self, resources: SubstrateResources) -> None:
        if resources.adapter_path is None:
            raise SubstrateError(f"substrate {PARAMETRIC} needs an adapter path (the LoRA-T+D adapter)")
        super().__init__(resources)
