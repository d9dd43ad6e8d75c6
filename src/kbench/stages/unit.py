"""The one skeleton every lane's unit of work runs through: a cell, a replay suite, a memory system.

A unit is an output folder made from declared inputs (`inputs.json`). `open_unit` checks them
before any work: the same inputs keep what the folder holds; a foreign digest, or an
`inputs.json` that cannot be read, starts the unit over (said in one log line, the file named).
A unit made of parts (a suite's sessions, a system's instances) keeps each finished part in
`Parts`, which rewrites the part files atomically, in plan order, as each part finishes, so a
killed stage loses only the parts in flight. `worker_backend` and `worker_corpus` are a pool
worker's model and corpus, loaded once per process. A unit ends with `tracking.record_output`: its
manifest and, with tracking, its MLflow run (`on_new_run` logs a lane's sessions or instances as traces).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from kbench import io
from kbench.backends import Backend, build_backend
from kbench.config import ModelConfig
from kbench.corpus import Corpus, load_corpus

log = logging.getLogger(__name__)

#: The inputs a unit's folder was made from; a unit whose inputs differ starts over.
INPUTS_FILE = "inputs.json"

Record = TypeVar("Record", bound=BaseModel)
Trace = TypeVar("Trace", bound=BaseModel)


def _as_json(data: Mapping[str, Any]) -> Any:
    """`data` as it reads back from `inputs.json` (paths and other objects as their text)."""
    return json.loads(json.dumps(data, default=str))


def read_inputs(folder: Path) -> dict | None:
    """The inputs `folder` was made from; None when it has none, or (with one warning line naming
    the file) when its `inputs.json` cannot be read as a JSON object."""
    path = folder / INPUTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("%s is unreadable (%s): starting its unit over", path, type(exc).__name__)
        return None
    if not isinstance(data, dict):
        log.warning("%s is unreadable (not a JSON object): starting its unit over", path)
        return None
    return data


def open_unit(folder: Path, inputs: Mapping[str, Any], *, what: str, stale: Sequence[str] = ()) -> bool:
    """Prepare `folder` for a unit made from `inputs`; True when what it holds was made from the
    same inputs and is kept (less the `stale` files, which the unit writes again at its end).
    Otherwise the folder is emptied, one line saying so when it held work, and the unit starts over.
    `inputs.json` is then (re)written."""
    wanted = _as_json(inputs)
    kept = False
    if folder.exists():
        previous = read_inputs(folder)
        kept = previous == wanted
        if not kept:
            if previous is not None:
                log.warning("%s: made from other inputs; starting %s over", folder, what)
            shutil.rmtree(folder)
        else:
            for name in stale:
                (folder / name).unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    io.write_json(folder / INPUTS_FILE, inputs, default=str)
    return kept


@dataclass(frozen=True)
class PartFiles(Generic[Record, Trace]):
    """Where a unit keeps its finished parts, and how its records and traces name their part."""

    #: The records file (JSON Lines), e.g. sessions.jsonl.
    records: str
    #: The traces file (JSON Lines), e.g. turns.jsonl.
    traces: str
    #: The per-part information file (a JSON object keyed by part id), e.g. sessions.json.
    info: str
    #: Reads the records file.
    read_records: Callable[[Path], list[Record]]
    #: Writes the records file atomically.
    write_records: Callable[[Path, list[Record]], Any]
    #: Reads the traces file.
    read_traces: Callable[[Path], list[Trace]]
    #: The part a record belongs to.
    record_part: Callable[[Record], str]
    #: The part a trace belongs to.
    trace_part: Callable[[Trace], str]


class Parts(Generic[Record, Trace]):
    """The finished parts of one unit in plan order: each part's information, records and traces."""

    def __init__(self, folder: Path, files: PartFiles[Record, Trace], order: Sequence[str]) -> None:
        self.folder, self.files, self.order = folder, files, list(order)
        self.info: dict[str, dict] = {}
        self._records: dict[str, list[Record]] = {}
        self._traces: dict[str, list[Trace]] = {}

    def resume(self, keep: Callable[[str, dict, list[Record], list[Trace]], bool] | None = None) -> None:
        """Take back the parts a kept folder holds (those of the plan that `keep` accepts); an
        unreadable part file: one warning line naming it, and every part runs again."""
        folder, files = self.folder, self.files
        try:
            info = json.loads((folder / files.info).read_text(encoding="utf-8"))
            records = files.read_records(folder / files.records) if (folder / files.records).exists() else []
            traces = files.read_traces(folder / files.traces) if (folder / files.traces).exists() else []
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s: a part file is unreadable (%s): running every part again", folder, exc)
            return
        wanted = set(self.order)
        for part, entry in info.items():
            if part not in wanted:
                continue
            own = [r for r in records if files.record_part(r) == part]
            own_traces = [t for t in traces if files.trace_part(t) == part]
            if keep is None or keep(part, entry, own, own_traces):
                self.info[part], self._records[part], self._traces[part] = entry, own, own_traces

    def __contains__(self, part: object) -> bool:
        return part in self.info

    def __len__(self) -> int:
        return len(self.info)

    def done(self) -> list[str]:
        """The finished parts, in plan order."""
        return [part for part in self.order if part in self.info]

    def add(self, part: str, info: dict, records: list[Record], traces: list[Trace]) -> None:
        """A finished part: kept, and every part file rewritten."""
        self.info[part], self._records[part], self._traces[part] = info, records, traces
        self.write()

    def write(self) -> None:
        """The part files, atomically, in plan order whatever order the parts finished in."""
        order, files = self.done(), self.files
        files.write_records(self.folder / files.records, self.records())
        io.write_jsonl(self.folder / files.traces, self.traces())
        io.write_json(self.folder / files.info, {part: self.info[part] for part in order})

    def records(self) -> list[Record]:
        return [r for part in self.done() for r in self._records[part]]

    def traces(self) -> list[Trace]:
        return [t for part in self.done() for t in self._traces[part]]

    def infos(self) -> dict[str, dict]:
        """Each finished part's information, in plan order."""
        return {part: self.info[part] for part in self.done()}


@functools.cache
def _worker_backend(model_json: str) -> Backend:
    return build_backend(ModelConfig.model_validate_json(model_json))


def worker_backend(model: ModelConfig) -> Backend:
    """The model of `model`, built once per worker process for every unit it runs."""
    return _worker_backend(model.model_dump_json())


@functools.cache
def worker_corpus(folder: Path) -> Corpus:
    """The corpus at `folder`, loaded once per worker process."""
    return load_corpus(folder)


__all__ = ["INPUTS_FILE", "PartFiles", "Parts", "open_unit", "read_inputs",
           "worker_backend", "worker_corpus"]
