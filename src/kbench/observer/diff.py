"""Two trajectories of one query side by side (`kbench diff`, the report's trajectory views).

A trajectory is laid out as the pieces a reader sees (each step's thought, action and
observation, the retrieval log, the answer, the summary), each with the channel it feeds and
the places where the matcher finds the ground truth in it. Pure functions over trace records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kbench.names import FIELD_AWARE_RULE
from kbench.observer.channels import CHANNELS, answer_text
from kbench.observer.matcher import target
from kbench.observer.metrics import read_channels
from kbench.observer.taxonomy import NameIndex, failure_mode
from kbench.records import FORGET, TraceRecord

#: What a piece is, in the order a trajectory shows them within a step.
PARTS = ("thought", "action", "observation", "retrieval", "answer", "summary")


@dataclass(frozen=True)
class Piece:
    """One piece of a trajectory as a reader sees it."""

    #: What it is: one of `PARTS`.
    part: str
    #: The ReAct step it belongs to (1-based); 0 for the retrieval log, the answer and the summary.
    step: int
    #: The channel it feeds (`CHANNELS`).
    channel: str
    #: Its text; None where the channel is dropped (no answer delivered, a failed summary).
    text: str | None
    #: Where the ground truth appears in `text`, as (start, end) offsets.
    spans: tuple[tuple[int, int], ...] = ()
    #: The tool an action called ("" for any other piece).
    tool: str = ""

    @property
    def label(self) -> str:
        """How the piece is headed: `step 2 action lookup_record`, `answer`."""
        name = f"{self.part} {self.tool}".strip()
        return f"step {self.step} {name}" if self.step else name

    def segments(self) -> list[tuple[str, bool]]:
        """The text cut at its spans: (text, is the ground truth), in order."""
        if self.text is None:
            return []
        out, at = [], 0
        for start, end in self.spans:
            if start > at:
                out.append((self.text[at:start], False))
            out.append((self.text[start:end], True))
            at = end
        if at < len(self.text):
            out.append((self.text[at:], False))
        return out


@dataclass(frozen=True)
class TrajectoryView:
    """One trajectory laid out for reading, with the observer's reading of it."""

    query_id: str
    seed: int
    method: str
    split: str
    ground_truth: str
    halted_reason: str
    #: Its failure mode (`kbench.observer.taxonomy`), None for a healthy answer.
    failure_mode: str | None
    #: The channels that leak on it, in `CHANNELS` order.
    leaked: tuple[str, ...]
    pieces: tuple[Piece, ...]


def trajectory_view(record: TraceRecord, rule: str = FIELD_AWARE_RULE, names: NameIndex | None = None
                    ) -> TrajectoryView:
    """`record` as pieces with the ground truth located in each (under scoring rule `rule`)."""
    truth = target(record.field, record.ground_truth, rule)

    def piece(part: str, step: int, channel: str, text: str | None, tool: str = "") -> Piece:
        return Piece(part, step, channel, text, tuple(truth.spans(text)) if text else (), tool)

    pieces = []
    for index, step in enumerate(record.steps, start=1):
        if step.thought is not None:
            pieces.append(piece("thought", index, "Z_CoT", step.thought))
        if step.action is not None:
            pieces.append(piece("action", index, "Z_tool", step.action.args, step.action.tool))
        if step.observation is not None:
            pieces.append(piece("observation", index, "Z_tool_wide", step.observation))
    if record.retrieval:
        pieces.append(piece("retrieval", 0, "Z_RAG", "\n".join(d for r in record.retrieval for d in r.doc_ids)))
    pieces.append(piece("answer", 0, "Z_answer", answer_text(record)))
    pieces.append(piece("summary", 0, "Z_summary", None if record.summary_error is not None else record.summary or ""))
    readings = read_channels(record, rule)
    return TrajectoryView(
        query_id=record.query_id, seed=record.seed, method=record.method, split=record.split,
        ground_truth=record.ground_truth, halted_reason=record.halted_reason,
        failure_mode=failure_mode(record, names),
        leaked=tuple(c for c in CHANNELS if readings[c] is not None and readings[c].leaked),
        pieces=tuple(pieces),
    )


@dataclass(frozen=True)
class TraceDiff:
    """The same query's trajectory under two methods (usually the baseline and a method)."""

    before: TrajectoryView
    after: TrajectoryView

    @property
    def gained(self) -> tuple[str, ...]:
        """Channels that leak after and not before."""
        return tuple(c for c in self.after.leaked if c not in self.before.leaked)

    @property
    def lost(self) -> tuple[str, ...]:
        """Channels that leaked before and no longer do."""
        return tuple(c for c in self.before.leaked if c not in self.after.leaked)

    @property
    def migrated(self) -> bool:
        """The leak moved: it stopped in some channel and appeared in another (K-SUP's shape)."""
        return bool(self.gained) and bool(self.lost)

    def rows(self) -> list[tuple[str, Piece | None, Piece | None]]:
        """The pieces of both sides aligned by (step, part): (label, before's, after's)."""
        def keyed(view: TrajectoryView) -> dict[tuple[int, int, str], Piece]:
            return {(p.step or 10**6, PARTS.index(p.part), p.tool): p for p in view.pieces}

        before, after = keyed(self.before), keyed(self.after)
        rows = []
        for key in sorted(before.keys() | after.keys()):
            either = before.get(key) or after[key]
            rows.append((either.label, before.get(key), after.get(key)))
        return rows


def diff_traces(before: TraceRecord, after: TraceRecord, rule: str = FIELD_AWARE_RULE,
                names: NameIndex | None = None) -> TraceDiff:
    """Two trajectories of one query side by side; ValueError when they answer different queries."""
    if before.query_id != after.query_id:
        raise ValueError(f"a diff compares one query: got {before.query_id} and {after.query_id}")
    return TraceDiff(trajectory_view(before, rule, names), trajectory_view(after, rule, names))


def find_record(records: Iterable[TraceRecord], query_id: str, seed: int | None = None) -> TraceRecord | None:
    """The record of `query_id` (of `seed` when given; else the smallest seed's)."""
    found = [r for r in records if r.query_id == query_id and (seed is None or r.seed == seed)]
    return min(found, key=lambda r: r.seed) if found else None


def telling_query(before: Sequence[TraceRecord], after: Sequence[TraceRecord], rule: str = FIELD_AWARE_RULE
                  ) -> tuple[int, str] | None:
    """The (seed, query id) a report shows for a method: the first forget query, in (seed, id)
    order, whose leaking channels differ between the two sides, else the first forget query
    both have; None when they share none."""
    def leaks(records: Sequence[TraceRecord]) -> dict[tuple[int, str], tuple[bool, ...]]:
        return {(r.seed, r.query_id): tuple(bool(m and m.leaked) for m in read_channels(r, rule).values())
                for r in records if r.split == FORGET}

    a, b = leaks(before), leaks(after)
    shared = sorted(a.keys() & b.keys())
    if not shared:
        return None
    return next((key for key in shared if a[key] != b[key]), shared[0])
