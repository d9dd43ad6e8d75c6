"""R-struct store: one SQLite table of person records.

Every query binds its values as parameters and selects a fixed column list, so a
model-written argument such as `x'); DROP TABLE records;--` is only a name that is not found.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from kbench.records import FIELDS, Entity

_COLUMNS = ("entity_id", "name", *FIELDS)


def name_key(name: str) -> str:
    """Names match case- and whitespace-insensitively."""
    return " ".join(name.lower().split())


class RecordStore:
    def __init__(self, entities: Iterable[Entity], path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS records (entity_id TEXT PRIMARY KEY, name TEXT, name_key TEXT, "
            "date_of_birth TEXT, address TEXT, occupation TEXT, employer TEXT)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS by_name ON records(name_key)")
        self._db.executemany(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (e.id, e.name, name_key(e.name), e.date_of_birth, e.address, e.occupation, e.employer)
                for e in entities
            ],
        )
        self._db.commit()

    def find(self, name: str, visible: frozenset[str] | None = None) -> dict[str, str] | None:
        """The record of the person called `name` among `visible` ids (all when None), or None."""
        rows = self._db.execute(
            "SELECT entity_id, name, date_of_birth, address, occupation, employer "
            "FROM records WHERE name_key = ? ORDER BY entity_id",
            (name_key(name),),
        ).fetchall()
        for row in rows:
            record = dict(zip(_COLUMNS, row))
            if visible is None or record["entity_id"] in visible:
                return record
        return None

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
