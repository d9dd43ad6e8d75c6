"""The unlearning-method interface and its registry (SPEC §11).

A method is one module with one registered class. It declares the substrates it can act on
and the hooks it uses; the harness calls exactly those:

- `weights`: `edit_weights(backend)`, once per cell before any query;
- `input`:   `rewrite_input(query, conversation)`, before every generation for that query;
- `forward`: `forward_hooks(backend, queries)`, a context manager entered around every batched
  generation (it learns which query each batch row belongs to);
- `output`:  `filter_output(query, text)`, on every generated text before it is parsed.

`weights` and `forward` need a backend with weights; asking for them on the openai backend
is an error at cell set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import ClassVar, Literal

from kbench.backends import Backend, Conversation
from kbench.config import Params
from kbench.corpus import Corpus
from kbench.records import Query
from kbench.registry import Registry
from kbench.substrates import substrate_names

Hook = Literal["weights", "input", "forward", "output"]
_HOOK_FUNCTIONS: dict[str, str] = {
    "weights": "edit_weights",
    "input": "rewrite_input",
    "forward": "forward_hooks",
    "output": "filter_output",
}
WEIGHT_HOOKS: frozenset[str] = frozenset({"weights", "forward"})
#: Every substrate registered when the methods load (the built-in four, SPEC §3).
ALL_SUBSTRATES: frozenset[str] = frozenset(substrate_names())


class MethodError(ValueError):
    """A method is unknown, misdeclared, or asked to run where it cannot."""


@dataclass(frozen=True)
class MethodContext:
    """What a method may fit itself on: the corpus (adapter pools only, SPEC §11) and params."""

    corpus: Corpus
    params: Params
    seed: int


class Method:
    name: ClassVar[str]
    substrates: ClassVar[frozenset[str]]
    hooks: ClassVar[frozenset[Hook]]

    def __init__(self, context: MethodContext) -> None:
        self.context = context

    @property
    def needs_weights(self) -> bool:
        return bool(self.hooks & WEIGHT_HOOKS)

    def edit_weights(self, backend: Backend) -> None:
        """Change the model once per cell."""

    def rewrite_input(self, query: Query, conversation: Conversation) -> Conversation:
        return conversation

    def forward_hooks(self, backend: Backend, queries: Sequence[Query]) -> AbstractContextManager:
        return nullcontext()

    def filter_output(self, query: Query, text: str) -> str:
        return text

    def check_deployable(self, substrate: str, backend: Backend) -> None:
        if substrate not in self.substrates:
            raise MethodError(
                f"method {self.name!r} cannot act on substrate {substrate!r}; "
                f"it acts on {sorted(self.substrates)}"
            )
        if self.needs_weights and not backend.has_weights:
            raise MethodError(
                f"method {self.name!r} uses the {sorted(self.hooks & WEIGHT_HOOKS)} hook(s), which need "
                f"model weights; the {backend.name} backend has none (use model.backend: hf)"
            )


_METHODS: Registry[type[Method]] = Registry("method", MethodError)


def register_method(
    name: str, *, substrates: frozenset[str], hooks: frozenset[Hook] = frozenset()
) -> Callable[[type[Method]], type[Method]]:
    def decorate(cls: type[Method]) -> type[Method]:
        unknown = set(substrates) - set(substrate_names())
        if unknown:
            raise MethodError(f"method {name!r} names unknown substrate(s) {sorted(unknown)}")
        overridden = {
            hook for hook, function in _HOOK_FUNCTIONS.items()
            if getattr(cls, function) is not getattr(Method, function)
        }
        if overridden != set(hooks):
            raise MethodError(
                f"method {name!r} declares hooks {sorted(hooks)} but implements {sorted(overridden)}"
            )
        cls.name, cls.substrates, cls.hooks = name, frozenset(substrates), frozenset(hooks)
        return _METHODS.add(name, cls)

    return decorate


def unregister_method(name: str) -> None:
    """Remove a method (tests register throw-away methods)."""
    _METHODS.remove(name)


def method_names() -> list[str]:
    return _METHODS.names()


def method_class(name: str) -> type[Method]:
    return _METHODS.get(name)


def build_method(name: str, context: MethodContext) -> Method:
    return method_class(name)(context)
