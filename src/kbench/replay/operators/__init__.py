"""The forgetting operators (docs/replay.md, "Sessions and operators": B0–B9, B5′), one registered file each.

An operator takes the contaminated state after turn T (through an `OperatorContext`) and
returns a `Branch`: the state the post-revocation turns run on and, for B8 and B9, the sink
policy those turns obey. The driver measures each operator's own cost around `apply`: the agent
turns the runtime ran, the tokens it fed through the model (prefill and decode) and the seconds;
an operator never states its cost.

A new operator is one module with a class decorated by `register_operator`, and no other file
changes (docs/replay.md, "Adding an operator"): a module in this package, found by scanning it,
or a module of your own project named in an entry point of the group `kbench.operators`
(`[project.entry-points."kbench.operators"]`, `my-operator = "my_package.my_operator"`).
`kbench list operators` lists them: the built-in ones in the paper's order, then the others by id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from kbench.registry import Registry, import_entry_points, import_package_and_plugins
from kbench.replay.environment import SessionEnvironment
from kbench.replay.records import OPERATOR_ID_LENGTH, operator_order
from kbench.replay.runtime import SessionRuntime, SessionState, SinkPolicy


class OperatorError(ValueError):
    """An unknown operator, or one that cannot act on a session."""


@dataclass
class Branch:
    """One operator's result: the state the post-revocation turns run on."""

    state: SessionState
    #: The sink policy of the post-revocation turns (B8, B9), or None.
    policy: SinkPolicy | None = None
    #: Agent turns the runtime ran within `apply` (B0 none, B5 T, B7 T − τ + 1), tokens it fed
    #: through the model there and the seconds: the driver measures them, whatever `apply` set.
    transitions: int = 0
    recomputed_tokens: int = 0
    seconds: float = 0.0


class OperatorContext:
    """What an operator may use: the runtime, the contaminated state (fork it, never change it),
    the revoked source, τ and the taint closure, and the other operators' branches."""

    def __init__(self, runtime: SessionRuntime, contaminated: SessionState, *, source: str, tau: int,
                 closure: frozenset[str], branch_of: Callable[[str], Branch]) -> None:
        self.runtime, self.contaminated = runtime, contaminated
        self.source, self.tau, self.closure = source, tau, closure
        self._branch_of = branch_of

    @property
    def plan(self):  # noqa: ANN201 - the session's plan
        return self.runtime.plan

    def sanitized_env(self, *, snapshot: str | None = None, fresh: bool = False) -> SessionEnvironment:
        """The world without z: as the contaminated run left it, as it was at `snapshot`, or
        (`fresh`) as it was at the session's start; the messages already delivered stay delivered."""
        if fresh:
            snapshot = self.runtime.snapshots[0].checkpoint.environment
        return self.contaminated.env.fork(withheld=self.runtime.withheld, snapshot=snapshot)

    def origins(self) -> set[str]:
        """The artifacts where z's source entered: they carry s and none of their parents does."""
        artifacts = self.contaminated.graph.artifacts
        return {a.id for a in artifacts.values() if self.source in a.source_ids
                and not any(self.source in artifacts[p].source_ids for p in a.parents)}

    def branch(self, operator: str) -> Branch:
        """Another operator's branch (computed once per session; its cost is its own, not the caller's)."""
        return self._branch_of(operator)

    def rebuild(self, state: SessionState) -> None:
        """Prefill a rebuilt prompt now (the operator's own work): the KV state then holds it,
        keeping its common prefix with what it held."""
        if state.kv is None:
            return
        conversation = state.conversation(self.runtime.config.max_iters)
        tokens = self.runtime.kv.encode(conversation)
        self.runtime.kv.prefill([state.kv], [tokens])


class Operator(ABC):
    """One way of acting on a forget request (z, s) after turn T."""

    #: Its id in records and tables ("B0".."B9", "B5'" for the built-in ones).
    id: ClassVar[str]
    #: What it does, in a few words.
    title: ClassVar[str]

    @abstractmethod
    def apply(self, context: OperatorContext) -> Branch:
        """The state the post-revocation turns run on."""


_OPERATORS: Registry[type[Operator]] = Registry("operator", OperatorError)


def register_operator(id: str, title: str) -> Callable[[type[Operator]], type[Operator]]:
    """Register an operator under `id`, the id its records carry (a record holds any non-empty id
    of up to `OPERATOR_ID_LENGTH` characters); `kbench list operators` shows it with `title`."""
    if not 0 < len(id) <= OPERATOR_ID_LENGTH:
        raise OperatorError(f"operator id {id!r} must have 1 to {OPERATOR_ID_LENGTH} characters")

    def decorate(cls: type[Operator]) -> type[Operator]:
        _OPERATORS.add(id, cls)  # first: an id taken leaves the class as it was
        cls.id, cls.title = id, title
        return cls

    return decorate


def unregister_operator(name: str) -> None:
    """Forget a registered operator (a test's plugin, when it is done)."""
    _OPERATORS.remove(name)


def operator_names() -> list[str]:
    """The registered operators: the built-in ones in the paper's order, then the others by id
    (`kbench.replay.records.operator_order`)."""
    _load()
    return sorted(_OPERATORS.names(), key=operator_order)


def build_operator(name: str) -> Operator:
    _load()
    return _OPERATORS.get(name)()


def operator_class(name: str) -> type[Operator]:
    _load()
    return _OPERATORS.get(name)


#: The entry-point group a distribution names its operator modules in.
ENTRY_POINT_GROUP = "kbench.operators"


def load_plugins() -> list[str]:
    """Import every module named in the `kbench.operators` entry points (in name order), which
    registers its operators; returns the modules. The first lookup of an operator runs it."""
    return import_entry_points(ENTRY_POINT_GROUP)


def _load() -> None:
    """Import every module of this package, then (once) the plugins: each registers its entry."""
    import_package_and_plugins(__name__, __path__, ENTRY_POINT_GROUP)


__all__ = ["ENTRY_POINT_GROUP", "Branch", "Operator", "OperatorContext", "OperatorError", "build_operator",
           "load_plugins", "operator_class", "operator_names", "register_operator", "unregister_operator"]
