"""Where a memory system's fact sits (beyond the paper): each probe reply as a K-Bench trace
record (docs/definitions.md, "The trace record"), so the six-channel observer reads a memory system's leak
too. The system's
memory writes (adds, updates, rewrites, indexed or appended turns; a deletion is not one) from
the first forget request's session on are its tool arguments (Z_tool),
what its memory put in front of the model for the question is its retrieval (Z_RAG), the reply
is the answer and what it keeps after the dialogue is the summary channel; it writes no
thought. The ground truth is the fact the probe is about: for RA, FE and AR the value a request
removes (F6: the old one), for PR and RLA the probe's own value. Pure: records in, rates out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kbench.memory.records import (
    ATTACK_RESISTANCE,
    CONTROL_VERSION,
    FORGET_EFFICACY,
    FORGET_VERSION,
    RETENTION,
    ItemRecord,
)
from kbench.memory.scoring import forgotten_value
from kbench.observer.metrics import channel_hit_rates
from kbench.records import FORGET, RETAIN, Action, Retrieval, Step, TraceRecord

#: The tool name a memory operation is recorded under in a probe trace.
MEMORY_TOOL = "memory"
#: The probe families whose probes are about a fact a request removes.
_ABOUT_FORGOTTEN = (RETENTION, FORGET_EFFICACY, ATTACK_RESISTANCE)


class MemoryTrace(TraceRecord):
    """A probe reply as a trace record: K-Bench's fields, with the fact's kind as `field`."""

    #: The fact's kind: a corpus field (the matcher's forms for dates and addresses) or another kind.
    field: str  # type: ignore[assignment]
    #: The memory system that replied (also `method`).
    system: str
    #: The probe family (RA, FE, PR, RLA or AR); the field keeps the paper's word, `suite`.
    suite: str
    #: The dialogue version it was asked on.
    version: str


def probe_truth(record: ItemRecord) -> str:
    """The value whose presence a probe trace's channels are read for."""
    return forgotten_value(record) if record.suite in _ABOUT_FORGOTTEN else record.value


def probe_trace(record: ItemRecord, *, question: str, supplied: str, operations: Sequence[str],
                kept: str) -> MemoryTrace:
    """The trace of one probe reply to `question`: `supplied`, what the system's memory put in the prompt;
    `operations`, its memory operations from the first request's session on; `kept`, its memory
    after the dialogue."""
    attack = f"/{record.attack}" if record.attack else ""
    return MemoryTrace(
        query_id=f"{record.instance_id}/{record.version}/{record.suite}{attack}/{record.probe_id}",
        entity_id=record.instance_id, split=FORGET if record.request_id else RETAIN, field=record.field,
        ground_truth=probe_truth(record), seed=0, substrate=MEMORY_TOOL, method=record.system,
        steps=[Step(action=Action(tool=MEMORY_TOOL, args=op)) for op in operations],
        retrieval=[Retrieval(query=question, doc_ids=[supplied])] if supplied else [],
        answer=record.reply, raw_reply=record.reply, halted_reason="final_answer", summary=kept,
        summary_error=None, question=question, system=record.system, suite=record.suite,
        version=record.version,
    )


def channel_rates(traces: Iterable[MemoryTrace]) -> dict[str, dict[str, Any]]:
    """Per version, over the probes about a forgotten fact (FE and AR on the forget version; RA
    and AR, their twins, on the control version): `n` and per channel the fraction that holds it."""
    traces = list(traces)
    return {
        FORGET_VERSION: channel_hit_rates(t for t in traces if t.version == FORGET_VERSION
                                         and t.suite in (FORGET_EFFICACY, ATTACK_RESISTANCE)),
        CONTROL_VERSION: channel_hit_rates(t for t in traces if t.version == CONTROL_VERSION
                                          and t.suite in (RETENTION, ATTACK_RESISTANCE)),
    }
