"""One registry type for every pluggable kind (backends, substrates, methods, tools).

A kind keeps a `Registry` of named entries and offers the same functions around it:
`register_<kind>` (a decorator), `<kind>_names()`, and one way to use an entry by name
(`build_<kind>(...)` for the kinds a cell constructs; `call_tool` for tools). A new backend,
substrate, method or tool is then a module with a decorated class or function and no change
to core code, and an unknown name is answered with the registered ones.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Iterable
from importlib.metadata import entry_points
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

    def entries(self) -> list[T]:
        """Every entry, in the order it was registered."""
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def import_submodules(package: str, path: Iterable[str], *, skip: Collection[str] = ()) -> None:
    """Import every module of `package` (at `path`, its `__path__`) but those named in `skip`:
    each registers its entries when imported."""
    for module in pkgutil.iter_modules(path):
        if module.name not in skip:
            importlib.import_module(f"{package}.{module.name}")


def import_entry_points(group: str) -> list[str]:
    """Import every module named in the entry points of `group` of the installed distributions
    (`[project.entry-points."<group>"]`), in entry-point name order: each registers its entries
    when imported. Returns the modules; a module imported before is not imported again."""
    loaded = []
    for point in sorted(entry_points(group=group), key=lambda p: (p.name, p.value)):
        importlib.import_module(point.module)
        loaded.append(point.module)
    return loaded


#: The entry-point groups whose plugins this process has imported (each is read once).
_PLUGIN_GROUPS: set[str] = set()


def import_package_and_plugins(package: str, path: Iterable[str], group: str) -> None:
    """Import every module of `package`, then, the first time only, those named in `group`'s
    entry points: what a kind's first lookup runs (operators, memory systems)."""
    import_submodules(package, path)
    if group not in _PLUGIN_GROUPS:
        _PLUGIN_GROUPS.add(group)
        import_entry_points(group)
