"""The forgetting operators of SPEC §14 (B0–B9, B5′), one registered file each.

An operator takes the contaminated state after turn T (through an `OperatorContext`) and
returns a `Branch`: the state the post-revocation turns run on, the agent turns it ran and, for
B8 and B9, the sink policy those turns obey. The driver measures each operator's own cost
(tokens fed through the model, seconds) around `apply`. A new operator is one module here
with a class decorated by `register_operator`; `kbench replay operators` lists them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from kbench.backends.hf import encode_prompt
from kbench.registry import Registry, import_submodules
from kbench.replay.environment import SessionEnvironment
from kbench.replay.records import OPERATORS
from kbench.replay.runtime import SessionRuntime, SessionState, SinkPolicy


class OperatorError(ValueError):
    """An unknown operator, or one that cannot act on a session."""


@dataclass
class Branch:
    """One operator's result: the state the post-revocation turns run on."""

    state: SessionState
    #: Agent turns the operator ran (B0 none, B5 T, B7 T − τ + 1).
    transitions: int = 0
    #: The sink policy of the post-revocation turns (B8, B9), or None.
    policy: SinkPolicy | None = None
    #: Tokens it fed through the model and its seconds (the driver fills them in).
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
        """Another operator's branch (computed once per session; B9 starts from B7's)."""
        return self._branch_of(operator)

    def rebuild(self, state: SessionState) -> None:
        """Prefill a rebuilt prompt now (the operator's own work): the KV state then holds it,
        keeping its common prefix with what it held."""
        if state.kv is None:
            return
        conversation = state.conversation(self.runtime.config.max_iters)
        tokens = encode_prompt(self.runtime.backend.tokenizer, conversation)
        self.runtime.backend.engine.prefill([state.kv], [tokens], share_prefixes=False)  # type: ignore[attr-defined]


class Operator(ABC):
    """One way of acting on a forget request (z, s) after turn T."""

    #: Its id in records and tables ("B0".."B9", "B5'").
    id: ClassVar[str]
    #: What it does, in a few words.
    title: ClassVar[str]

    @abstractmethod
    def apply(self, context: OperatorContext) -> Branch:
        """The state the post-revocation turns run on."""


_OPERATORS: Registry[type[Operator]] = Registry("operator", OperatorError)


def register_operator(id: str, title: str) -> Callable[[type[Operator]], type[Operator]]:
    if id not in OPERATORS:
        raise OperatorError(f"operator id {id!r} is not one of SPEC §14's {OPERATORS}")

    def decorate(cls: type[Operator]) -> type[Operator]:
        cls.id, cls.title = id, title
        _OPERATORS.add(id, cls)
        return cls

    return decorate


def operator_names() -> list[str]:
    """The registered operators in SPEC §14's order."""
    _load()
    return sorted(_OPERATORS.names(), key=lambda n: OPERATORS.index(n) if n in OPERATORS else len(OPERATORS))


def build_operator(name: str) -> Operator:
    _load()
    return _OPERATORS.get(name)()


def operator_class(name: str) -> type[Operator]:
    _load()
    return _OPERATORS.get(name)


def _load() -> None:
    """Import every module of this package (each registers its entry)."""
    import_submodules(__name__, __path__)


__all__ = ["Branch", "Operator", "OperatorContext", "OperatorError", "build_operator", "operator_class",
           "operator_names", "register_operator"]
