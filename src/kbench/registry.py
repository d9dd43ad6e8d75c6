"""One registry type for every pluggable kind (backends, substrates, methods).

A kind keeps a `Registry` of named entries; a decorator adds one, so a new backend,
substrate or method is a module with a decorated class and no change to core code.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, error: type[Exception] = ValueError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise self.error(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(f"unknown {self.kind} {name!r}; registered: {self.names()}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)
