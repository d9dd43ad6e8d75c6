"""The one atomic writer: every file a stage writes goes through here.

A file is written to a temporary sibling, flushed to disk and renamed over its final name, so
a reader (or a rerun after a kill) sees either the old file or the whole new one, never a
torn one. A folder (a model, an index) is built under a temporary sibling and renamed into
place the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
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


# -- integrity -------------------------------------------------------------------------------
#: The content hashes a stage writes into each output folder it builds (adapters, models, the index).
HASHES_FILE = "hashes.json"


class IntegrityError(ValueError):
    """A stage output's file differs from the hash its stage recorded (changed or damaged)."""


def feed_file(digest: Any, path: str | Path) -> None:
    """Update a hashlib digest with a file's bytes, a megabyte at a time."""
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    feed_file(digest, path)
    return digest.hexdigest()


def file_hashes(folder: str | Path, *, exclude: Iterable[str] = ()) -> dict[str, str]:
    """The SHA-256 of every file under `folder` by its relative POSIX path (the one file-hashing
    rule of the project: manifests, output hashes and input digests all use it)."""
    folder, skipped = Path(folder), set(exclude)
    return {
        path.relative_to(folder).as_posix(): file_sha256(path)
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in skipped
    }


def json_digest(data: Any) -> str:
    """A short digest of JSON-able data (keys sorted): equal exactly when the data are equal."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:20]


def folder_hash(folder: str | Path) -> str:
    """The digest of a folder's files and their relative paths (`file_hashes`)."""
    return json_digest(file_hashes(folder))


def write_hashes(folder: str | Path) -> dict[str, str]:
    """Record the SHA-256 of every file in `folder` (by relative path) in its HASHES_FILE; call it
    last, inside the `atomic_dir` block that builds the folder."""
    hashes = file_hashes(folder, exclude=[HASHES_FILE])
    write_json(Path(folder) / HASHES_FILE, hashes)
    return hashes


def verify_hashes(folder: str | Path, what: str = "stage output") -> None:
    """Raise IntegrityError unless every file HASHES_FILE lists has the hash recorded there."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / HASHES_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IntegrityError(f"{folder} has no {HASHES_FILE}: not a {what} this version of kbench wrote; "
                             "rerun its stage (dvc repro)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{folder / HASHES_FILE} is corrupt ({exc}); rerun its stage (dvc repro)") from None
    if not isinstance(recorded, dict):
        raise IntegrityError(f"{folder / HASHES_FILE} is corrupt (a JSON object expected)")
    for name in recorded:
        if not (folder / name).is_file():
            raise IntegrityError(f"{folder / name} is missing from the {what} (listed in {HASHES_FILE}); rerun its stage")
    checked_at = time.time_ns()
    identities = tuple(_file_identity(folder / name) for name in sorted(recorded))
    signature = (json.dumps(recorded, sort_keys=True), identities)
    key = str(folder.resolve())
    if _VERIFIED.get(key) == signature:
        return
    for name, expected in recorded.items():
        path = folder / name
        actual = file_sha256(path)
        if actual != expected:
            raise IntegrityError(
                f"{path}: content hash {actual[:16]}… differs from {expected[:16]}…, the hash its stage "
                f"recorded: the file was changed or damaged after it was written; rerun the stage "
                f"(dvc repro) or restore it (dvc checkout)"
            )
    # A file modified less than a clock tick before the check could be modified again with the
    # same time stamp: only files older than RACY_NS are remembered (git's "racily clean" rule).
    if all(mtime < checked_at - RACY_NS for _, _, mtime in identities):
        _VERIFIED[key] = signature


#: Folders this process has verified, with the identity of their files then: a folder whose
#: files are the same files, unchanged since (same inode, size and modification time), is not
#: hashed again (a cell worker loads the same agent base and adapters cell after cell).
_VERIFIED: dict[str, tuple] = {}
#: How old a file's modification time must be for the check to be remembered.
RACY_NS = 2_000_000_000


def _file_identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


# -- reading JSON Lines ------------------------------------------------------------------------
def read_lines(path: str | Path, error: type[Exception]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line of a UTF-8 file; a byte that is not UTF-8
    raises `error` naming the file, line, byte and column."""
    path = Path(path)
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(f"{path}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                            f"{exc.start + 1})") from None
            if line.strip():
                yield lineno, line


def json_object(line: str, where: str, error: type[Exception], what: str = "a record") -> dict[str, Any]:
    """One JSON Lines line as an object; anything else raises `error` prefixed with `where`."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to be {what}") from None
    if not isinstance(data, dict):
        raise error(f"{where}: {what} must be a JSON object, not {type(data).__name__}")
    return data


def read_json_lines(path: str | Path, error: type[Exception], what: str = "a record") -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON Lines file (see `json_object`)."""
    for lineno, line in read_lines(path, error):
        yield lineno, json_object(line, f"{path}:{lineno}", error, what)
