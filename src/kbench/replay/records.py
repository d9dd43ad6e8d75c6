"""The execution-state lane's session record (docs/replay.md, "The session record"): one JSON object per
session × operator,
JSON Lines on disk.

The lane's names (operators, probes) are defined here once; the scorer, the command line and
the operators import them from this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kbench import io
from kbench.config import format_validation_error

#: The built-in operators' ids in the paper's order: B0 no-forget ... B9 selective replay then
#: flow control; B5' full reset reusing cached prefixes. A plugin operator has an id of its own.
OPERATORS: tuple[str, ...] = ("B0", "B1", "B2", "B3", "B4", "B5", "B5'", "B6", "B7", "B8", "B9")
#: The longest operator id a record holds.
OPERATOR_ID_LENGTH = 32
#: An operator's id in a record: any registered one (docs/replay.md, "Adding an operator").
OperatorId = Annotated[str, Field(min_length=1, max_length=OPERATOR_ID_LENGTH)]
#: The six probes asked after the post-revocation turns.
Probe = Literal["task", "direct", "think", "introspect", "enumerate", "cued"]

PROBES: tuple[str, ...] = get_args(Probe)
#: No forgetting; the memory-delete operator that the paper finds behaves exactly like it.
NO_FORGET, MEMORY_DELETE = "B0", "B1"
#: The full reset over the sanitized stream: the counterfactual every operator is compared with.
FULL_RESET = "B5"
#: Selective replay from the last checkpoint before τ.
SELECTIVE_REPLAY = "B7"


def operator_order(operator: str) -> tuple[int, str]:
    """The sort key of operator ids: the built-in ones in the paper's order, then any other by name."""
    return (OPERATORS.index(operator), "") if operator in OPERATORS else (len(OPERATORS), operator)


#: What a session computes, as a version: raised when the runtime or an operator changes what a
#: session runs, so the replay stage never resumes sessions that older code ran (its inputs.json has it).
SESSION_VERSION = 2


class SessionFormatError(ValueError):
    """A sessions file line that is not a valid session record; names the file and line."""


class ToolCall(BaseModel):
    """One tool call of a post-revocation turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The tool's name.
    tool: str
    #: Its arguments as the agent gave them.
    args: dict[str, Any] = {}


class BlockedCall(BaseModel):
    """One call a sink policy blocked (B8, B9): it never ran, and no record lists it elsewhere."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The post-revocation turn it was made in.
    turn: int
    #: The tool's name (`remember` for a memory write).
    tool: str
    #: Its arguments as the agent gave them.
    args: dict[str, Any] = {}


class PostTurn(BaseModel):
    """One post-revocation turn, the same turns under every operator."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The turn's number in the session (after T).
    turn: int
    #: Whether the turn's task needs z (its B0 solution uses it).
    depends_on_target: bool
    #: The agent's final answer of the turn; null when it gave none.
    answer: str | None
    #: The turn's tool calls, in order.
    tool_calls: list[ToolCall] = []
    #: The memory notes the turn wrote.
    memory_writes: list[str] = []


class SessionRecord(BaseModel):
    """One session under one operator (docs/replay.md, "The session record")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The session, shared by its records under every operator.
    session_id: str
    #: The suite it belongs to (`kbench-sessions`, `agentdojo-workspace`, ...).
    suite: str
    #: The operator applied after turn T.
    operator: OperatorId
    #: z, the string to forget.
    target: str = Field(min_length=1)
    #: z's corpus field when it is one (the matcher then also finds its field variants); null: z itself.
    target_field: str | None = None
    #: The turn at which z first entered the state (1-based).
    tau: int = Field(ge=1)
    #: The turns before the revocation.
    T: int = Field(ge=1)
    #: Agent turns the runtime ran within the operator's work (B0 none, B5 T, B7 T − τ + 1 when it works).
    transitions: int = Field(ge=0)
    #: Tokens the runtime fed through the model within the operator's work, prefill and decode.
    recomputed_tokens: int = Field(ge=0)
    #: Wall-clock seconds of the operator's own work (not part of the final-state hash).
    seconds: float = Field(ge=0)
    #: The post-revocation turns.
    post: list[PostTurn]
    #: The tool calls and memory writes of the post-revocation turns that the operator's sink
    #: policy blocked (B8, B9), in order; kept out of `post`. Empty for an operator without one.
    blocked_calls: list[BlockedCall] = []
    #: Each probe's reply.
    probes: dict[Probe, str]
    #: Each probe's k replies sampled at `replay.temperature` (Leak@k); empty when not sampled.
    probe_samples: dict[Probe, list[str]] = {}
    #: sha256 of the final prompt inventory's token ids and every post-revocation output.
    final_state_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def key(self) -> tuple[str, str, str]:
        return self.suite, self.session_id, self.operator


def read_sessions(paths: Iterable[str | Path]) -> list[SessionRecord]:
    """Every record of the files, checked: a line that is not a record is an error naming it,
    and so is a (suite, session, operator) seen twice or a session whose records disagree on
    z, τ or T."""
    records: list[SessionRecord] = []
    seen: dict[tuple[str, str, str], str] = {}
    sessions: dict[tuple[str, str], tuple[str, SessionRecord]] = {}
    for path in paths:
        for lineno, data in io.read_json_lines(path, SessionFormatError, "a session record"):
            where = f"{path}:{lineno}"
            try:
                record = SessionRecord.model_validate(data)
            except ValidationError as exc:
                raise SessionFormatError(f"{where}: invalid session record: {format_validation_error(exc)}") from None
            if record.tau > record.T:
                raise SessionFormatError(f"{where}: tau {record.tau} is after T {record.T}")
            if record.key in seen:
                raise SessionFormatError(f"{where}: session {record.session_id} of suite {record.suite} under "
                                         f"{record.operator} appears twice (first at {seen[record.key]})")
            seen[record.key] = where
            first = sessions.setdefault((record.suite, record.session_id), (where, record))
            for name in ("target", "target_field", "tau", "T"):
                if getattr(first[1], name) != getattr(record, name):
                    raise SessionFormatError(f"{where}: session {record.session_id} has {name} "
                                             f"{getattr(record, name)!r} here and {getattr(first[1], name)!r} "
                                             f"at {first[0]}")
            records.append(record)
    return records


def write_sessions(path: str | Path, records: Iterable[SessionRecord]) -> Path:
    """Session records as JSON Lines, written atomically."""
    return io.write_jsonl(path, records)


def iter_leaves(value: Any) -> Iterator[str]:
    """Every leaf of a tool call's arguments as text (a number or a bool by its JSON form)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from iter_leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_leaves(item)
    elif isinstance(value, str):
        yield value
    elif value is not None:
        yield io.json_text(value).strip()
