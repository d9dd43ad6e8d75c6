"""Import transcripts of the published K-Bench release as TraceRecords, so they can be rescored.

The release writes one JSON object per query with the channel texts already split out
(`raw_Z_CoT`, `raw_Z_tool`, `raw_Z_tool_obs`, `raw_Z_RAG`, `answer`, `raw_Z_summary`) plus
`halted_reason`, `summary_error`, `ground_truth`, `field` and, in its files, `query_id`,
`pii_id` and `raw_full`. The mapping onto the trace record (docs/definitions.md, "The trace record";
docs/observer.md lists it too):

- steps: step i gets the i-th thought, the i-th tool call and the i-th observation. The
  release keeps the three lists separately, so the pairing is by position; channel texts do
  not depend on it, and "no thought and no action" (the bare-reply exception) is preserved.
- tool names are not recorded; actions carry the tool name `UNRECORDED_TOOL`, which no
  channel reads (Z_tool is argument values only).
- raw_Z_RAG: each element is one search's doc ids (a list) or a single doc id; the searches'
  query strings are not recorded and are left empty.
- raw_reply: `raw_full` when present, else empty, in which case the bare-reply exception can
  never apply (there is no reply to read).
- summary: `raw_Z_summary`; an empty summary with `summary_error` set is dropped
(docs/definitions.md, "The six channels and when one is dropped").
- ids: `query_id` if present, else "<entity_id>::<field>"; `entity_id` from `entity_id`,
  `pii_id`, or the part of `query_id` before "::".
- seed and split: the option given, else the record's own `seed` / `split`, else the release
  file name (`..._<split>_seed<N>.jsonl`); substrate and method: the option or the record's
  own value. Anything still unknown is an error naming the line and what to pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbench.records import TraceRecord, iter_json_objects, validate_trace

UNRECORDED_TOOL = "unrecorded"

#: Fields every release transcript must carry.
PUBLISHED_FIELDS: tuple[str, ...] = (
    "raw_Z_CoT",
    "raw_Z_tool",
    "raw_Z_tool_obs",
    "raw_Z_RAG",
    "answer",
    "raw_Z_summary",
    "halted_reason",
    "summary_error",
    "ground_truth",
    "field",
)

_FILE_SPLIT = re.compile(r"(?:^|_)(forget|retain)(?:_|\.|$)")
_FILE_SEED = re.compile(r"seed(\d+)")


class PublishedFormatError(ValueError):
    """A release transcript that cannot be mapped; names the file, line and field."""


@dataclass(frozen=True)
class CellLabels:
    """What the release files do not say per record; None: infer from the record or file name."""

    substrate: str | None = None
    method: str | None = None
    seed: int | None = None
    split: str | None = None


def _text(value: Any) -> str:
    """A channel entry as text: nested lists and objects (as some release rows hold) are
    flattened with spaces, which is how the release's own scorer reads them."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text(item) for item in value)
    if isinstance(value, dict):
        return " ".join(_text(item) for item in value.values())
    return str(value)


def _texts(data: dict[str, Any], key: str, where: str) -> list[str]:
    value = data[key]
    if value is None:
        return []
    if not isinstance(value, list):
        raise PublishedFormatError(f"{where}: field '{key}' must be a list, got {type(value).__name__}")
    return [_text(item) for item in value]


def _labels_from_file(path: Path) -> CellLabels:
    split = _FILE_SPLIT.search(path.stem)
    seed = _FILE_SEED.search(path.stem)
    return CellLabels(
        seed=int(seed.group(1)) if seed else None,
        split=split.group(1) if split else None,
    )


def _pick(name: str, given: Any, data: dict[str, Any], where: str, hint: str) -> Any:
    """The option if given, else the record's own value, else an error saying what to pass."""
    for value in (given, data.get(name)):
        if value is not None:
            return value
    raise PublishedFormatError(f"{where}: cannot tell the record's {name}; {hint}")


def convert_record(data: dict[str, Any], labels: CellLabels, where: str) -> dict[str, Any]:
    """One release transcript as trace-record data (docs/definitions.md, "The trace record"; validated by the
    caller)."""
    missing = [key for key in PUBLISHED_FIELDS if key not in data]
    if missing:
        raise PublishedFormatError(f"{where}: missing field(s) {missing} of a release transcript")
    field = data["field"]
    entity_id = data.get("entity_id") or data.get("pii_id")
    query_id = data.get("query_id")
    if entity_id is None and isinstance(query_id, str) and "::" in query_id:
        entity_id = query_id.split("::", 1)[0]
    if entity_id is None:
        raise PublishedFormatError(f"{where}: no 'query_id', 'pii_id' or 'entity_id' to identify the entity")
    thoughts = _texts(data, "raw_Z_CoT", where)
    tool_args = _texts(data, "raw_Z_tool", where)
    observations = _texts(data, "raw_Z_tool_obs", where)
    steps = [
        {
            "thought": thoughts[i] if i < len(thoughts) else None,
            "action": {"tool": UNRECORDED_TOOL, "args": tool_args[i]} if i < len(tool_args) else None,
            "observation": observations[i] if i < len(observations) else None,
        }
        for i in range(max(len(thoughts), len(tool_args), len(observations)))
    ]
    searches = data["raw_Z_RAG"] or []
    if not isinstance(searches, list):
        raise PublishedFormatError(f"{where}: field 'raw_Z_RAG' must be a list")
    retrieval = [
        {"query": "", "doc_ids": [_text(d) for d in (hit if isinstance(hit, list) else [hit])]}
        for hit in searches
    ]
    return {
        "query_id": query_id or f"{entity_id}::{field}",
        "entity_id": entity_id,
        "split": _pick("split", labels.split, data, where, "pass --split forget|retain"),
        "field": field,
        "ground_truth": data["ground_truth"],
        "seed": _pick("seed", labels.seed, data, where, "pass --seed N"),
        "substrate": _pick("substrate", labels.substrate, data, where, "pass --substrate S"),
        "method": _pick("method", labels.method, data, where, "pass --method M"),
        "steps": steps,
        "retrieval": retrieval,
        "answer": data["answer"],
        "raw_reply": _text(data.get("raw_full")),
        "halted_reason": data["halted_reason"],
        "summary": data["raw_Z_summary"],
        "summary_error": data["summary_error"],
    }


def import_published(path: str | Path, labels: CellLabels | None = None) -> Iterator[TraceRecord]:
    """Stream a release transcript file as validated TraceRecords.

    Options in `labels` win over the record's own values, which win over the file name.
    """
    path = Path(path)
    labels = labels or CellLabels()
    from_file = _labels_from_file(path)
    for lineno, data in iter_json_objects(path):
        for name in ("seed", "split"):
            if data.get(name) is None:
                data[name] = getattr(from_file, name)
        record = convert_record(data, labels, f"{path}:{lineno}")
        yield validate_trace(record, source=str(path), lineno=lineno)
