"""Where a forgotten fact still sits (beyond the paper): after the forget version's dialogue, does
the system's own memory (`MemorySystem.memory`: its stored facts, summary, index or transcript)
still hold the value a request asked to forget? Read with the project's matcher, per request
and by request type. A reply can stay silent while the memory keeps the fact, ready for the next
question or the next retrieval. The control version's memory says whether the system stores
anything at all ("stores nothing"). Pure: item records and memory texts in, rates out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kbench.memory.records import (
    CONTROL_VERSION,
    DELETE_INFERRED,
    FORGET_EFFICACY,
    FORGET_VERSION,
    PRESERVATION,
    REQUEST_TYPES,
    RETENTION,
    ItemRecord,
)
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


def stated_facts(records: Iterable[ItemRecord]) -> dict[str, set[tuple[str, str]]]:
    """Per instance, the (field, value) of each fact the control version's dialogue states: each RA
    probe's (F6: the old value) but F4's, which is inferred and never stated, and each PR probe's."""
    facts: dict[str, set[tuple[str, str]]] = {}
    for record in records:
        if record.suite == RETENTION and record.request_type != DELETE_INFERRED:
            facts.setdefault(record.instance_id, set()).add((record.field, forgotten_value(record)))
        elif record.suite == PRESERVATION and record.version == CONTROL_VERSION:
            facts.setdefault(record.instance_id, set()).add((record.field, record.value))
    return facts


def stores_nothing(records: Iterable[ItemRecord], memories: Mapping[str, Mapping[str, str]]) -> bool | None:
    """True when, on every instance whose memory is known, the system's own memory after the control
    version's dialogue holds none of the facts that dialogue states (docs/memory.md, "Stores nothing"):
    its FE and AR then measure no forgetting. None when no such instance states a fact."""
    known = {iid: facts for iid, facts in stated_facts(records).items()
             if memories.get(iid, {}).get(CONTROL_VERSION) is not None and facts}
    if not known:
        return None
    return not any(match(field, value, memories[iid][CONTROL_VERSION], FIELD_AWARE_RULE).leaked
                   for iid, facts in known.items() for field, value in facts)
