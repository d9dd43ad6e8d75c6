"""Where a forgotten fact still sits (beyond the paper): after the forget version's dialogue, does
the system's own memory (`MemorySystem.memory`: its stored facts, summary, index or transcript)
still hold the value a request asked to forget? Read with the project's matcher, per request
and by request type. A reply can stay silent while the memory keeps the fact, ready for the next
question or the next retrieval. Pure: item records and memory texts in, rates out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kbench.memory.records import FORGET_EFFICACY, FORGET_VERSION, REQUEST_TYPES, ItemRecord
from kbench.memory.scoring import Residue, ResidueRate, forgotten_value
from kbench.names import FIELD_AWARE_RULE
from kbench.observer.matcher import match


def residues(records: Iterable[ItemRecord], memories: Mapping[str, Mapping[str, str]]) -> list[tuple[str, bool]]:
    """(request type, whether the forget version's memory still holds the forgotten value) for
    each FE probe (one per requested fact) of an instance whose memory is known."""
    found = []
    for record in records:
        memory = memories.get(record.instance_id, {}).get(FORGET_VERSION)
        if record.suite != FORGET_EFFICACY or record.version != FORGET_VERSION or memory is None:
            continue
        found.append((record.request_type, match(record.field, forgotten_value(record), memory, FIELD_AWARE_RULE).leaked))
    return found


def residue_rates(records: Iterable[ItemRecord], memories: Mapping[str, Mapping[str, str]]) -> Residue:
    """The fraction of requested facts still in memory: overall (`rate`, `n`) and by request type."""
    found = residues(records, memories)

    def rate(rows: list[bool]) -> ResidueRate:
        return ResidueRate(rate=sum(rows) / len(rows) if rows else None, n=len(rows))

    overall = rate([kept for _, kept in found])
    return Residue(rate=overall.rate, n=overall.n,
                   by_request_type={t: rate([kept for kind, kept in found if kind == t]) for t in REQUEST_TYPES})
