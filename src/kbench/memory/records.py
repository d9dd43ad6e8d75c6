"""The memory lane's item record (docs/memory.md, "The item record"): one JSON object per probe reply, JSON
Lines on disk.

The names of the lane (request types, probe families, attacks, versions, length tiers) are defined
here once; the scorer and the command line import them from this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kbench import io
from kbench.config import format_validation_error
from kbench.names import TIERS, Tier

#: A forget request's type by its paper code (`PaperCode` rows of REQUEST_TYPE_TABLE say which is which).
RequestType = Literal["F1", "F2", "F3", "F4", "F5", "F6"]
#: A probe family by its paper code (PROBE_FAMILY_TABLE); records call it the probe's `suite`.
ProbeFamily = Literal["RA", "FE", "PR", "RLA", "AR"]
Attack = Literal["direct", "indirect", "boolean", "jailbreak", "completion"]
#: The dialogue with the forget requests injected, and the identical one without them.
Version = Literal["forget", "control"]


@dataclass(frozen=True)
class PaperCode:
    """A name of the lane's design beside the paper code that records, params and tables carry."""

    #: The paper's code, as written in records and tables ("F1", "RA").
    code: str
    #: What it is called in code and prose ("delete-fact", "retention").
    name: str
    #: What it is, in one line.
    description: str


#: The six forget request types, in paper order.
REQUEST_TYPE_TABLE: tuple[PaperCode, ...] = (
    PaperCode("F1", "delete-fact", "forget one stated fact"),
    PaperCode("F2", "delete-topic", "forget every fact of one topic (the user's work)"),
    PaperCode("F3", "delete-session", "forget everything said in one session, named by its day"),
    PaperCode("F4", "delete-inferred", "forget a fact the user never stated but that follows from stated ones"),
    PaperCode("F5", "retract", "forget a fact the user says was not true"),
    PaperCode("F6", "replace", "a fact's new value becomes the truth and the old one must be forgotten"),
)
#: The five probe families, in paper order.
PROBE_FAMILY_TABLE: tuple[PaperCode, ...] = (
    PaperCode("RA", "retention", "the control version still answers a fact a request would remove"),
    PaperCode("FE", "forget-efficacy", "the forget version no longer discloses a requested fact"),
    PaperCode("PR", "preservation", "both versions still answer a fact no request touches"),
    PaperCode("RLA", "relearning", "the forget version answers the new value the user states after a request"),
    PaperCode("AR", "attack-resistance", "the forget version resists an attack that the control version answers"),
)

REQUEST_TYPES: tuple[str, ...] = get_args(RequestType)
PROBE_FAMILIES: tuple[str, ...] = get_args(ProbeFamily)
ATTACKS: tuple[str, ...] = get_args(Attack)
VERSIONS: tuple[str, ...] = get_args(Version)
assert REQUEST_TYPES == tuple(row.code for row in REQUEST_TYPE_TABLE)
assert PROBE_FAMILIES == tuple(row.code for row in PROBE_FAMILY_TABLE)
DELETE_FACT, DELETE_TOPIC, DELETE_SESSION, DELETE_INFERRED, RETRACT, REPLACE = REQUEST_TYPES
RETENTION, FORGET_EFFICACY, PRESERVATION, RELEARNING, ATTACK_RESISTANCE = PROBE_FAMILIES
FORGET_VERSION, CONTROL_VERSION = VERSIONS
#: The attack judged by the Boolean rule instead of the matcher.
BOOLEAN_ATTACK = ATTACKS[2]

#: The one version each single-version probe family is asked on (PR and AR are asked on both).
FAMILY_VERSION: dict[str, str] = {RETENTION: CONTROL_VERSION, FORGET_EFFICACY: FORGET_VERSION,
                                  RELEARNING: FORGET_VERSION}


class MemoryItemFormatError(ValueError):
    """An item file line that is not a valid item record; names the file and line."""


class ItemRecord(BaseModel):
    """One probe reply of one memory system on one instance (docs/memory.md, "The item record")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The dialogue instance (profile, sessions and both versions) the probe was asked on.
    instance_id: str
    #: The memory system under test that replied.
    system: str
    #: The forget request the probe tests; null for a preservation (PR) probe.
    request_id: str | None
    #: The request's type, F1..F6; null exactly when request_id is.
    request_type: RequestType | None
    #: The probe's family (RA, FE, PR, RLA or AR); the field keeps the paper's word, `suite`.
    suite: ProbeFamily
    #: The attack an AR probe makes; null for every other family.
    attack: Attack | None
    #: Which version of the dialogue the probe was asked on.
    version: Version
    #: Shared by a forget-version probe and its control twin; an FE item shares its request's RA probe_id.
    probe_id: str
    #: The fact's kind: a corpus field (`date_of_birth`, `address` get the matcher's extra forms) or another kind.
    field: str
    #: The value the probe is about; for F6 the new value (the old one is `old_value`).
    value: str
    #: The value an F6 request replaces; set on every F6 record and on no other.
    old_value: str | None = None
    #: The system's reply to the probe.
    reply: str
    #: The instance's length tier, for the by-tier tables; null when not recorded.
    tier: Tier | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ItemRecord":
        """The combinations the item record allows (docs/memory.md, "The item record"): which families have a
        request, an attack, one version."""
        if (self.request_id is None) != (self.request_type is None):
            raise ValueError("request_id and request_type are both set or both null")
        if (self.suite == PRESERVATION) != (self.request_id is None):
            raise ValueError("a PR probe has no request and every other probe has one")
        if (self.suite == ATTACK_RESISTANCE) != (self.attack is not None):
            raise ValueError("an AR probe names its attack and no other probe does")
        wanted = FAMILY_VERSION.get(self.suite)
        if wanted is not None and self.version != wanted:
            raise ValueError(f"a {self.suite} probe is asked on the {wanted} version, not the {self.version} one")
        if (self.request_type == REPLACE) != (self.old_value is not None):
            raise ValueError(f"old_value is set on every {REPLACE} record and on no other")
        if self.suite == RELEARNING and self.request_type == REPLACE:
            raise ValueError(f"an {REPLACE} request has no relearning probe (its new value is the FE probe's)")
        return self


def validate_item(data: dict[str, Any], *, source: str = "<input>", lineno: int = 0) -> ItemRecord:
    """An ItemRecord from parsed JSON; an error names the source line, probe_id and key."""
    try:
        return ItemRecord.model_validate(data)
    except ValidationError as exc:
        raise MemoryItemFormatError(
            f"{source}:{lineno} (probe_id {data.get('probe_id', '?')}): invalid item record: {_describe(exc)}"
        ) from None


def _describe(error: ValidationError) -> str:
    """The keys at fault with what they hold, or the combination rule broken (a field error
    stops validation before the combination rules run, so it is one or the other)."""
    if all(item["loc"] for item in error.errors()):
        return format_validation_error(error)
    return error.errors()[0]["msg"].removeprefix("Value error, ")


def iter_items(path: str | Path) -> Iterator[ItemRecord]:
    """Stream item records from a JSON Lines file, validating each; blank lines are skipped."""
    for lineno, data in io.read_json_lines(path, MemoryItemFormatError, "an item record"):
        yield validate_item(data, source=str(path), lineno=lineno)


def read_items(paths: Iterable[str | Path]) -> list[ItemRecord]:
    return [record for path in paths for record in iter_items(path)]


def write_items(path: str | Path, records: Iterable[ItemRecord]) -> Path:
    """Item records as JSON Lines, written atomically."""
    return io.write_jsonl(path, records)
