"""The one atomic writer: every file a stage writes goes through here.

A file is written to a temporary sibling, flushed to disk and renamed over its final name, so
a reader (or a rerun after a kill) sees either the old file or the whole new one, never a
torn one. A folder (a model, an index) is built under a temporary sibling and renamed into
place the same way.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

#: Suffix of a file or folder being written; a leftover one is an interrupted write.
PARTIAL_SUFFIX = ".tmp"


def _partial(path: Path) -> Path:
    return path.with_name(path.name + PARTIAL_SUFFIX)


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[Any]:
    """A handle on a temporary sibling of `path`, renamed over `path` when the block ends
    without an exception (removed otherwise)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(path)
    binary = "b" in mode
    try:
        with tmp.open(mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_open(path) as handle:
        handle.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_open(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def json_text(data: Any, *, sort_keys: bool = True, allow_nan: bool = True, default: Callable | None = None) -> str:
    """The project's JSON layout: indented by 2, keys sorted, a final newline."""
    return json.dumps(data, indent=2, sort_keys=sort_keys, allow_nan=allow_nan, default=default) + "\n"


def write_json(path: str | Path, data: Any, **options: Any) -> Path:
    """`data` as JSON (see `json_text` for the options), written atomically."""
    return write_text(path, json_text(data, **options))


def write_jsonl(path: str | Path, items: Iterable[BaseModel]) -> Path:
    """Pydantic models as JSON Lines, written atomically."""
    with atomic_open(path) as handle:
        for item in items:
            handle.write(item.model_dump_json() + "\n")
    return Path(path)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A fresh temporary folder beside `path`; when the block ends without an exception it
    replaces `path` (an older `path` is removed first), otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        tmp.replace(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
