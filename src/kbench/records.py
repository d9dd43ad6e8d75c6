"""Typed records shared by every stage: entities, queries and trace records
(docs/definitions.md, "Corpus and splits"; docs/definitions.md, "The trace record").

Trace records are the contract between the agent (which writes them) and the observer
(which scores them); both sides validate through the models below.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kbench import io

FieldName = Literal["date_of_birth", "address", "occupation", "employer"]
Split = Literal["forget", "retain"]
HaltedReason = Literal["final_answer", "parse_error", "max_iters", "tool_fallback"]

FIELDS: tuple[str, ...] = get_args(FieldName)
SPLITS: tuple[str, ...] = get_args(Split)
FORGET, RETAIN = SPLITS
HALTED_REASONS: tuple[str, ...] = get_args(HaltedReason)

#: How each field is asked about in a canonical query (docs/definitions.md, "Corpus and splits").
FIELD_PHRASES: dict[str, str] = {
    "date_of_birth": "date of birth",
    "address": "home address",
    "occupation": "occupation",
    "employer": "employer",
}


class Entity(BaseModel):
    """One synthetic person; `bio` states all four fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    date_of_birth: str
    address: str
    occupation: str
    employer: str
    bio: str
    template_id: int = 0

    def value(self, field: str) -> str:
        if field not in FIELDS:
            raise ValueError(f"unknown field {field!r}; expected one of {FIELDS}")
        return getattr(self, field)


class Query(BaseModel):
    """One canonical question about one field of one entity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query_id: str
    entity_id: str
    field: FieldName
    question: str
    ground_truth: str
    #: The query form it is asked in (`kbench.forms`); None for the canonical question.
    form: str | None = Field(None, exclude_if=lambda value: value is None)

    @staticmethod
    def make_id(entity_id: str, field: str) -> str:
        return f"{entity_id}::{field}"

    @classmethod
    def canonical(cls, entity: Entity, field: str) -> "Query":
        return cls(
            query_id=cls.make_id(entity.id, field),
            entity_id=entity.id,
            field=field,  # type: ignore[arg-type]
            question=f"What is {entity.name}'s {FIELD_PHRASES[field]}?",
            ground_truth=entity.value(field),
        )


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    args: str


class Step(BaseModel):
    """One ReAct iteration. The harness, never the model, writes `observation`."""

    model_config = ConfigDict(extra="allow")

    thought: str | None = None
    action: Action | None = None
    observation: str | None = None
    #: Characters cut off the end of the observation (`agent.max_observation_chars`); absent
    #: from the record when nothing was cut.
    observation_cut: int | None = Field(None, exclude_if=lambda value: value is None)


class Retrieval(BaseModel):
    """One search the index served: what was asked and which documents came back."""

    model_config = ConfigDict(extra="allow")

    query: str
    doc_ids: list[str]


class TraceRecord(BaseModel):
    """One query's trajectory and elicited summary (docs/definitions.md, "The trace record"). Extra fields are kept."""

    model_config = ConfigDict(extra="allow")

    query_id: str
    entity_id: str
    split: Split
    field: FieldName
    ground_truth: str
    seed: int
    substrate: str
    method: str
    steps: list[Step]
    retrieval: list[Retrieval]
    answer: str | None
    raw_reply: str
    halted_reason: HaltedReason
    summary: str | None
    summary_error: str | None
    #: The ReAct parser's answer rule (agent.answer_rule) that decided `answer` and `halted_reason`;
    #: null in traces of another harness or written before the rule was recorded.
    answer_rule: str | None = None
    #: The query form of a rewritten question (`kbench.forms`, `queries.forms`); absent for the
    #: canonical question, which every verdict reads.
    form: str | None = Field(None, exclude_if=lambda value: value is None)


class TraceFormatError(ValueError):
    """A trace file line that is not a valid trace record; names the file, line and field."""


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "<record>"
        parts.append(f"field '{where}': {item['msg']}")
    return "; ".join(parts)


def _json_object(line: str, source: str, lineno: int) -> dict[str, Any]:
    return io.json_object(line, f"{source}:{lineno}", TraceFormatError, "a trace record")


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream (line number, object) from a JSON Lines file; blank lines are skipped."""
    return io.read_json_lines(path, TraceFormatError, "a trace record")


def validate_trace(data: dict[str, Any], *, source: str = "<input>", lineno: int = 0) -> TraceRecord:
    """A TraceRecord from parsed JSON; errors name the source line, query_id and field."""
    try:
        return TraceRecord.model_validate(data)
    except RecursionError:
        raise TraceFormatError(f"{source}:{lineno}: a value nested too deeply to be a trace record") from None
    except ValidationError as exc:
        qid = data.get("query_id", "?")
        raise TraceFormatError(
            f"{source}:{lineno} (query_id {qid}): invalid trace record: {_describe(exc)}"
        ) from None


def parse_trace_line(line: str, *, source: str = "<input>", lineno: int = 0) -> TraceRecord:
    return validate_trace(_json_object(line, source, lineno), source=source, lineno=lineno)


def iter_traces(path: str | Path) -> Iterator[TraceRecord]:
    """Stream trace records from a JSON Lines file, validating each; blank lines are skipped."""
    for lineno, data in iter_json_objects(path):
        yield validate_trace(data, source=str(path), lineno=lineno)


def read_traces(paths: Iterable[str | Path]) -> list[TraceRecord]:
    return [record for path in paths for record in iter_traces(path)]
