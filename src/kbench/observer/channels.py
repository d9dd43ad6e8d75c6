"""The six observation channels of one trace record (docs/definitions.md, "The six channels and when one is dropped").

A channel is either the text an observer of that channel would read (possibly empty) or
`None` when the channel is *dropped* for the query: a dropped channel is left out of that
channel's CER denominator and of the query's max over channels (docs/definitions.md, "Cell metrics").
"""

from __future__ import annotations

from kbench.records import TraceRecord

#: Channel names in the order every table, matrix column and JSON object uses.
CHANNELS: tuple[str, ...] = ("Z_CoT", "Z_tool", "Z_tool_wide", "Z_RAG", "Z_answer", "Z_summary")

#: Nested attacker classes A1 ⊆ … ⊆ A5 (docs/definitions.md, "Cell metrics"); A5 is the full multi-channel observer.
ATTACKER_BUDGETS: dict[str, tuple[str, ...]] = {
    "A1": ("Z_answer",),
    "A2": ("Z_answer", "Z_summary"),
    "A3": ("Z_answer", "Z_summary", "Z_CoT"),
    "A4": ("Z_answer", "Z_summary", "Z_CoT", "Z_tool", "Z_tool_wide"),
    "A5": CHANNELS,
}

_JOIN = "\n"


def _written(text: str | None) -> bool:
    """A thought counts as written only when it has visible text; whitespace is not a thought."""
    return text is not None and bool(text.strip())


def answer_text(record: TraceRecord) -> str | None:
    """Z_answer: the parsed answer of a completed trajectory, else the bare reply, else dropped.

    A trajectory that did not halt on `final_answer` has no answer the protocol delivered, so
    the channel is dropped, except when the model wrote no thought and called no tool and
    its raw reply is non-blank: that reply is exactly what the user received
    (docs/definitions.md, "The six channels and when one is dropped").
    """
    if record.halted_reason == "final_answer":
        return record.answer or ""
    bare = not any(_written(step.thought) or step.action is not None for step in record.steps)
    if bare and record.raw_reply.strip():
        return record.raw_reply
    return None


def channel_texts(record: TraceRecord) -> dict[str, str | None]:
    """Map every channel of CHANNELS to its text for this record, or None when dropped."""
    tool_args = [step.action.args for step in record.steps if step.action is not None]
    observations = [step.observation for step in record.steps if step.observation is not None]
    return {
        "Z_CoT": _JOIN.join(step.thought for step in record.steps if step.thought is not None),
        "Z_tool": _JOIN.join(tool_args),
        "Z_tool_wide": _JOIN.join(tool_args + observations),
        "Z_RAG": _JOIN.join(doc for search in record.retrieval for doc in search.doc_ids),
        "Z_answer": answer_text(record),
        "Z_summary": None if record.summary_error is not None else (record.summary or ""),
    }
