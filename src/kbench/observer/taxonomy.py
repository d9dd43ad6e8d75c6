"""How a trajectory fails: the degeneration taxonomy (docs/definitions.md, "Failure modes").

Every degenerate trajectory (the health check of docs/definitions.md, "Cell metrics", `is_degenerate`) gets
exactly one failure
mode; a healthy one gets a mode only when its answer refuses, collapses or speaks of another
person of the corpus. Pure functions over trace records: the corpus's names come in as data
(`NameIndex`), never read here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kbench.records import TraceRecord

#: A protocol marker at the start of a line (leading spaces allowed): an answer holding one
#: carries a nested ReAct payload instead of an answer (the health check of docs/definitions.md, "Cell metrics").
_PROTOCOL_LINE = re.compile(r"^[ \t]*(Thought|Action|Observation|Final Answer):", re.MULTILINE)


def degeneration_triggers(record: TraceRecord) -> tuple[str, ...]:
    """Which health-check triggers (docs/definitions.md, "Cell metrics") a trajectory fires (empty: healthy)."""
    answer = record.answer or ""
    fired = []
    if record.halted_reason != "final_answer":
        fired.append("not_final_answer")
    if not answer.strip():
        fired.append("empty_answer")
    if _PROTOCOL_LINE.search(answer):
        fired.append("protocol_line_in_answer")
    if record.halted_reason == "tool_fallback":
        fired.append("tool_fallback")
    return tuple(fired)


def is_degenerate(record: TraceRecord) -> bool:
    return bool(degeneration_triggers(record))


#: The failure modes, in the order a trajectory is tested for them (the first that holds wins):
#: - tool_fallback: the harness stopped it after consecutive tool errors;
#: - tool_loop: it used all `max_iters` steps without answering;
#: - collapse: the answer (or the last reply) is empty, hardly text, or one phrase repeated;
#: - refusal: the answer declines or says the fact is unknown;
#: - name_binding: the answer names another person of the corpus, not the one asked about;
#: - format_break: protocol lines in the answer, or a reply the ReAct parser could not read.
FAILURE_MODES: tuple[str, ...] = ("tool_fallback", "tool_loop", "collapse", "refusal", "name_binding", "format_break")
TOOL_FALLBACK, TOOL_LOOP, COLLAPSE, REFUSAL, NAME_BINDING, FORMAT_BREAK = FAILURE_MODES

#: A refusal or a professed ignorance, anywhere in the text.
_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't|could\s+not|couldn't|am\s+not\s+able\s+to|am\s+unable\s+to)"
    r"\s+(?:know|find|provide|share|disclose|help|answer|say|recall|access|have|locate|determine)"
    r"|i'm\s+(?:not\s+able|unable)\s+to|i(?:'m|\s+am)\s+sorry|i\s+apologi[sz]e"
    r"|unable\s+to\s+(?:find|provide|answer|locate|determine)"
    r"|no\s+(?:information|record|records|data|details)\s+(?:about|on|for|of|is|are|was)"
    r"|(?:is|are)\s+not\s+(?:available|known|listed)|not\s+publicly\s+available)",
    re.IGNORECASE,
)
#: One unit of 2 to 40 characters repeated five times or more in a row.
_REPEATED_RUN = re.compile(r"(.{2,40}?)\1{4,}", re.DOTALL)
#: A text shorter than this is not judged for repetition or non-text (a date, a code).
_MIN_JUDGED = 12


def collapsed(text: str) -> bool:
    """Empty, mostly non-alphanumeric, a run of one repeated unit, or words whose 3-grams
    are mostly repeats (fewer than half distinct among 12 or more words)."""
    stripped = text.strip()
    if not stripped:
        return True
    if len(stripped) < _MIN_JUDGED:
        return False
    visible = [c for c in stripped if not c.isspace()]
    if sum(c.isalnum() for c in visible) < 0.5 * len(visible):
        return True
    if _REPEATED_RUN.search(stripped):
        return True
    words = stripped.lower().split()
    grams = list(zip(words, words[1:], words[2:]))
    return len(words) >= 12 and len(set(grams)) < 0.5 * len(grams)


def refuses(text: str) -> bool:
    """The text declines to answer or says it does not know."""
    return bool(_REFUSAL.search(text))


@dataclass(frozen=True)
class NameIndex:
    """The corpus's people by name, to tell whose name an answer carries."""

    #: entity id -> name.
    names: Mapping[str, str]
    #: Every name as one alternation, longest first, matched at word boundaries.
    pattern: re.Pattern[str] | None

    @classmethod
    def of(cls, people: Iterable[tuple[str, str]]) -> "NameIndex":
        """From (entity id, name) pairs (the corpus's entities)."""
        names = dict(people)
        spelled = sorted({n for n in names.values() if n.strip()}, key=lambda n: (-len(n), n))
        pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, spelled)) + r")\b") if spelled else None
        return cls(names, pattern)

    def binds_elsewhere(self, text: str, entity_id: str) -> bool:
        """The text names someone of the corpus and never the person `entity_id`."""
        if self.pattern is None:
            return False
        own = self.names.get(entity_id)
        found = set(self.pattern.findall(text))
        return bool(found) and own not in found


def final_text(record: TraceRecord) -> str:
    """What the failure modes read: the answer, or the last raw reply when there is none."""
    return record.answer if record.answer is not None else record.raw_reply


def failure_mode(record: TraceRecord, names: NameIndex | None = None) -> str | None:
    """The trajectory's failure mode (one of `FAILURE_MODES`), or None for a healthy answer.

    Without `names` no answer is judged a name binding."""
    if record.halted_reason == "tool_fallback":
        return TOOL_FALLBACK
    if record.halted_reason == "max_iters":
        return TOOL_LOOP
    text = final_text(record)
    if collapsed(text):
        return COLLAPSE
    if refuses(text):
        return REFUSAL
    if names is not None and names.binds_elsewhere(text, record.entity_id):
        return NAME_BINDING
    if is_degenerate(record) or _PROTOCOL_LINE.search(text):
        return FORMAT_BREAK
    return None


def mode_counts(modes: Sequence[str | None]) -> dict[str, int]:
    """How many trajectories have each failure mode (every mode present, 0 included)."""
    counted = Counter(m for m in modes if m is not None)
    return {mode: counted[mode] for mode in FAILURE_MODES}


def dominant_mode(counts: Mapping[str, int]) -> str | None:
    """The most frequent mode (ties: the earlier in `FAILURE_MODES`); None when all are 0."""
    best = max(FAILURE_MODES, key=lambda m: (counts.get(m, 0), -FAILURE_MODES.index(m)))
    return best if counts.get(best, 0) else None
