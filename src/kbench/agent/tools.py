"""The agent's tools, each registered with the signature and description the prompt shows.

Arguments come from the model, so they are untrusted text: they are split and normalised
here, bound as SQL parameters by the record store, and never evaluated. A tool that cannot
use its arguments returns an error observation (`ToolResult.error`), never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from kbench.records import FIELD_PHRASES, FIELDS, Query, Retrieval
from kbench.registry import Registry
from kbench.substrates import Substrate


@dataclass(frozen=True)
class ToolResult:
    observation: str
    error: bool = False
    retrieval: Retrieval | None = None
    #: Characters cut off the end of the observation (`agent.max_observation_chars`), 0 if none.
    cut: int = 0


@dataclass(frozen=True)
class ToolContext:
    """What one trajectory's tools may see: the substrate's stores scoped to the query."""

    substrate: Substrate
    query: Query
    top_k: int
    #: Longest observation the model is shown (`agent.max_observation_chars`); the rest is cut.
    max_observation_chars: int


ToolFunction = Callable[[ToolContext, list[str]], ToolResult]


@dataclass(frozen=True)
class Tool:
    name: str
    #: How the prompt writes a call, e.g. "search_wiki[query]".
    signature: str
    description: str
    #: How many comma-separated arguments it takes; the last one keeps any further commas.
    arity: int
    run: ToolFunction


_TOOLS: Registry[Tool] = Registry("tool")


def register_tool(name: str, *, params: tuple[str, ...], description: str) -> Callable[[ToolFunction], ToolFunction]:
    def decorate(function: ToolFunction) -> ToolFunction:
        _TOOLS.add(name, Tool(name, f"{name}[{', '.join(params)}]", description, len(params), function))
        return function

    return decorate


def registered_tools() -> list[Tool]:
    """The tools in registration order (the order the prompt lists them)."""
    return _TOOLS.entries()


def tool_names() -> list[str]:
    return _TOOLS.names()


_QUOTES = "\"'`“”‘’"
_KEYWORD = re.compile(r"^\s*(name|field|value|query|attribute)\s*[:=]\s*", re.IGNORECASE)


def split_args(args: str, arity: int) -> list[str]:
    """Split `a, b, c` into `arity` parts (the last keeps its commas: addresses have them)."""
    parts = args.split(",", arity - 1) if arity > 1 else [args]
    return [_KEYWORD.sub("", part).strip().strip(_QUOTES).strip() for part in parts]


_FIELD_ALIASES = {
    **{f: f for f in FIELDS},
    **{phrase: f for f, phrase in FIELD_PHRASES.items()},
    "dob": "date_of_birth",
    "birth date": "date_of_birth",
    "birthdate": "date_of_birth",
    "birthday": "date_of_birth",
    "born": "date_of_birth",
    "home": "address",
    "job": "occupation",
    "profession": "occupation",
    "work": "occupation",
    "company": "employer",
    "workplace": "employer",
}


def normalize_field(text: str) -> str | None:
    key = " ".join(text.lower().replace("_", " ").replace("-", " ").split())
    return _FIELD_ALIASES.get(key) or _FIELD_ALIASES.get(key.replace(" ", "_"))


def _bad_field(field: str) -> ToolResult:
    return ToolResult(f"Error: unknown field '{field}'. Fields: {', '.join(FIELDS)}.", error=True)


def _canonical(text: str) -> str:
    return " ".join(text.lower().split())


@register_tool(
    "search_wiki",
    params=("query",),
    description="search an encyclopedia of short biographies; returns the best passages.",
)
def search_wiki(context: ToolContext, args: list[str]) -> ToolResult:
    (text,) = args
    index = context.substrate.text_index
    if index is None:
        return ToolResult("No results found.")
    passages = index.search(text, context.top_k, context.substrate.searchable(context.query))
    retrieval = Retrieval(query=text, doc_ids=[p.doc_id for p in passages])
    if not passages:
        return ToolResult("No results found.", retrieval=retrieval)
    lines = [f"[{i}] {p.text}" for i, p in enumerate(passages, start=1)]
    return ToolResult("\n".join(lines), retrieval=retrieval)


def _record_and_field(context: ToolContext, name: str, field_text: str) -> tuple[dict, str] | ToolResult:
    """The named person's record and the normalized field, or the observation saying why not."""
    field = normalize_field(field_text)
    if field is None:
        return _bad_field(field_text)
    record = context.substrate.records.find(name, context.substrate.readable(context.query))
    if record is None:
        return ToolResult(f"No record found for '{name}'.")
    return record, field


@register_tool(
    "lookup_record",
    params=("name", "field"),
    description=f"read one field of a person's record from the database ({', '.join(FIELDS)}).",
)
def lookup_record(context: ToolContext, args: list[str]) -> ToolResult:
    name, field_text = args
    found = _record_and_field(context, name, field_text)
    if isinstance(found, ToolResult):
        return found
    record, field = found
    return ToolResult(f"{record['name']}'s {FIELD_PHRASES[field]}: {record[field]}")


@register_tool(
    "verify_attribute",
    params=("name", "field", "value"),
    description="check whether a person's record has the given value; answers yes or no.",
)
def verify_attribute(context: ToolContext, args: list[str]) -> ToolResult:
    name, field_text, value = args
    found = _record_and_field(context, name, field_text)
    if isinstance(found, ToolResult):
        return found
    record, field = found
    if _canonical(record[field]) == _canonical(value):
        return ToolResult(f"Yes: {record['name']}'s {FIELD_PHRASES[field]} is {value}.")
    return ToolResult(f"No: that is not {record['name']}'s {FIELD_PHRASES[field]}.")


def call_tool(context: ToolContext, tool_name: str, args: str) -> ToolResult:
    """Run one model-requested call; every failure comes back as an error observation."""
    requested = tool_name.strip().lower()
    if requested not in _TOOLS:
        # Listed in prompt order: this text is an observation the model reads.
        listed = ", ".join(t.name for t in registered_tools())
        return ToolResult(f"Error: unknown tool '{tool_name}'. Tools: {listed}.", error=True)
    tool = _TOOLS.get(requested)
    parts = split_args(args, tool.arity)
    if len(parts) < tool.arity or not all(parts):
        return ToolResult(f"Error: {tool.name} takes {tool.signature}.", error=True)
    try:
        result = tool.run(context, parts)
    except Exception as exc:  # a tool bug must end in an observation, not a crashed cell
        return ToolResult(f"Error: {tool.name} failed ({type(exc).__name__}).", error=True)
    return _capped(result, context.max_observation_chars)


def _capped(result: ToolResult, limit: int) -> ToolResult:
    """The result with its observation cut to `limit` characters and marked as cut (arguments
    come from the model, and an observation often echoes them)."""
    cut = len(result.observation) - limit
    if cut <= 0:
        return result
    return replace(result, observation=f"{result.observation[:limit]} [... {cut} characters cut]", cut=cut)
