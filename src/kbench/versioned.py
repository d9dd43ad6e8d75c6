"""Versioned result files: a replay suite's and a memory system's scores.json and
reports/comparison.json are pydantic models carrying a `schema_version`; a reader validates the
file against its model, so a file of another layout is refused in one line naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kbench.config import format_validation_error

#: The layout of the result files this kbench writes and reads; raised when a field changes.
SCHEMA_VERSION = 1


class VersionedFileError(ValueError):
    """A result file that its model cannot read (unreadable, unversioned, another version, a bad
    field); the message names the file, the field and the stage to rerun."""


class VersionedRecord(BaseModel):
    """The base of a versioned result file's model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The file's layout version (SCHEMA_VERSION when written); a reader refuses any other.
    schema_version: int = SCHEMA_VERSION


Record = TypeVar("Record", bound=VersionedRecord)


def read_versioned(path: str | Path, model: type[Record], *, stage: str) -> Record:
    """The file at `path` as `model`; `stage` is the DVC stage that writes it (named in errors)."""
    rerun = f"rerun its stage (`dvc repro {stage}`)"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VersionedFileError(f"{path} is unreadable ({exc}); rerun `dvc repro {stage}`") from None
    if not isinstance(data, dict):
        raise VersionedFileError(f"{path} is not a JSON object; {rerun}")
    if "schema_version" not in data:
        raise VersionedFileError(f"{path} was written before result files were versioned (no schema_version): {rerun}")
    if data["schema_version"] != SCHEMA_VERSION:
        raise VersionedFileError(f"{path} has schema_version {data['schema_version']!r}, this kbench reads "
                                 f"{SCHEMA_VERSION}: {rerun}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise VersionedFileError(f"{path} is not a valid {model.__name__}: {format_validation_error(exc)}; "
                                 f"{rerun}") from None
