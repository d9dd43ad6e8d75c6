"""The unlearning-method interface and its registry (docs/definitions.md, "Methods").

A method is one module with one registered class. It declares the substrates it can act on
and the hooks it uses; the harness calls exactly those:

- `weights`: `edit_weights(backend)`, once per cell before any query;
- `input`:   `rewrite_input(query, conversation)`, before every generation for that query;
- `forward`: `forward_hooks(backend, queries)`, a context manager entered around every batched
  generation (it learns which query each batch row belongs to);
- `output`:  `filter_output(query, text)`, on every generated text before it is parsed.

`weights` and `forward` need a backend with weights; asking for them on the openai backend
is an error at cell set-up.

A method's constants are its params section, `method_params.<name>`, validated by its
`Config` model and passed straight into its constructor, so a key means the same thing in
every run. A method that learns something (a direction, an eraser, a gate) implements
`fit(data)`: the `fit` stage calls it once per base model on the adapter pools
(`kbench.methods.fitting`), writes what it returns under `artifacts/fitted/<name>/`, and every
cell hands it back through `load_fitted` (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kbench.backends import Backend, Conversation
from kbench.config import ALL_METHODS, Params, ParamsError, format_validation_error
from kbench.corpus import Corpus
from kbench.records import Query
from kbench.registry import Registry
from kbench.substrates import substrate_names

if TYPE_CHECKING:
    import torch

Hook = Literal["weights", "input", "forward", "output"]
_HOOK_FUNCTIONS: dict[str, str] = {
    "weights": "edit_weights",
    "input": "rewrite_input",
    "forward": "forward_hooks",
    "output": "filter_output",
}
WEIGHT_HOOKS: frozenset[str] = frozenset({"weights", "forward"})
#: Every substrate registered when the methods load (the built-in four of
#: docs/definitions.md, "Substrates and the LoRA-D control").
ALL_SUBSTRATES: frozenset[str] = frozenset(substrate_names())


class MethodError(ValueError):
    """A method is unknown, misdeclared, or asked to run where it cannot."""


@dataclass(frozen=True)
class MethodContext:
    """What a method may fit itself on: the corpus (adapter pools only; docs/definitions.md, "Methods") and params."""

    corpus: Corpus
    params: Params
    seed: int


class MethodConfig(BaseModel):
    """A method's params section (`method_params.<name>`); a method subclasses it with its keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Fitted:
    """What a method's `fit` learned: tensors (saved as safetensors) and JSON diagnostics."""

    #: Named tensors the method needs at inference (directions, an eraser, probe weights).
    tensors: dict[str, "torch.Tensor"] = field(default_factory=dict)
    #: What the fit measured (held-out accuracies, erased directions, edit norms), for MLflow and docs.
    diagnostics: dict[str, Any] = field(default_factory=dict)


class Method:
    name: ClassVar[str]
    substrates: ClassVar[frozenset[str]]
    hooks: ClassVar[frozenset[Hook]]
    #: The family (docs/definitions.md, "Methods"; one of `FAMILIES`; set at registration, None when not declared).
    family: ClassVar[str | None] = None
    #: Where `methods: all` puts the method (`all_methods`; set at registration).
    order: ClassVar[int | None] = None
    #: The params section's model; `method_params.<name>` is validated by it.
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    #: True when the method learns something in the `fit` stage (it implements `fit`; set at registration).
    fits: ClassVar[bool] = False
    #: True for a weight method: the `unlearn` stage trains its loss on P (`kbench.methods.unlearning`).
    trains: ClassVar[bool] = False
    #: The method whose trained weights this one deploys (a variant that differs only at
    #: inference, e.g. O3 at another detector accuracy); None: its own.
    weights_of: ClassVar[str | None] = None
    #: True when the forward hook edits every batch row alike: rows may then share prefilled
    #: prompt prefixes (a hook that treats queries differently must not).
    uniform_forward: ClassVar[bool] = False

    def __init__(self, context: MethodContext, config: MethodConfig | None = None) -> None:
        self.context = context
        self.config = method_config(self.name, context.params) if config is None else config

    @classmethod
    def trained_as(cls) -> str:
        """The name the `unlearn` stage trains this method's weights under."""
        return cls.weights_of or cls.name

    @property
    def needs_weights(self) -> bool:
        return bool(self.hooks & WEIGHT_HOOKS)

    @classmethod
    def runs_without_weights(cls, serves_adapters: bool) -> bool:
        """Whether a backend without weights can deploy it; `serves_adapters`: its server applies
        LoRA adapters by name (a weight method whose weights are one adapter says yes to that)."""
        return not (cls.hooks & WEIGHT_HOOKS) and not cls.trains

    def fit(self, data: Any) -> Fitted:
        """Learn what the method needs from the adapter pools (`data`, a
        `kbench.methods.fitting.FitData`); called by the fit stage."""
        raise NotImplementedError(f"method {self.name!r} fits nothing")

    def load_fitted(self, fitted: Fitted) -> None:
        """Take back what `fit` returned (from `artifacts/fitted/<name>/`) before a cell runs."""

    def fresh_prompt(self, query: Query) -> bool:
        """True: every generation of `query` re-encodes its whole prompt instead of reusing the
        cached prefix (a forward hook that must see every prompt token, e.g. ECO's)."""
        return False

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
        if not backend.has_weights and not self.runs_without_weights(backend.serves_adapters):
            raise MethodError(
                f"method {self.name!r} uses the {sorted(self.hooks & WEIGHT_HOOKS)} hook(s), which need "
                f"model weights; the {backend.name} backend has none (use model.backend: hf)"
            )


_METHODS: Registry[type[Method]] = Registry("method", MethodError)

#: The method families of docs/definitions.md, "Methods", in its order (a method declares one at registration).
FAMILIES: tuple[str, ...] = (
    "control", "input corruption", "reasoning-trace filtering", "activation editing", "architectural gating",
    "gradient unlearning", "published roster", "reference",
)

def register_method(
    name: str, *, substrates: frozenset[str], hooks: frozenset[Hook] = frozenset(), family: str | None = None,
    order: int | None = None,
) -> Callable[[type[Method]], type[Method]]:
    """Register a method class under `name`: the substrates it can act on, the hooks it
    implements (checked against what it overrides), its family (one of `FAMILIES` for the
    built-in methods; `kbench list methods` shows it) and where `methods: all` puts it (`order`,
    ascending; None: after every method that declares one, by name)."""

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
        cls.family, cls.order = family, order
        cls.fits = cls.fit is not Method.fit
        return _METHODS.add(name, cls)

    return decorate


def unregister_method(name: str) -> None:
    """Remove a method (tests register throw-away methods)."""
    _METHODS.remove(name)


def method_names() -> list[str]:
    """Every registered method, by name."""
    return _METHODS.names()


def all_methods() -> list[str]:
    """What `methods: all` stands for: every registered method, by the `order` it declares
    (the built-in ones: the default run's grid as it has always been listed), then those that
    declare none, by name."""
    return sorted(method_names(), key=lambda name: (method_class(name).order is None, method_class(name).order or 0, name))


def method_class(name: str) -> type[Method]:
    return _METHODS.get(name)


def _validated(name: str, section: dict[str, Any]) -> MethodConfig:
    """One method's section validated by its `Config`; ParamsError naming the offending key."""
    try:
        return method_class(name).Config.model_validate(section)
    except ValidationError as exc:
        raise ParamsError(format_validation_error(exc, prefix=f"method_params.{name}")) from None


def method_config(name: str, params: Params) -> MethodConfig:
    """`method_params.<name>` validated by the method's `Config` (defaults where absent)."""
    try:
        return _validated(name, params.method_params.get(name) or {})
    except ParamsError as exc:
        raise ParamsError(f"params: {exc}") from None


def resolve_methods(params: Params) -> Params:
    """`params` with its methods resolved against the registry: `methods: all` replaced by
    `all_methods()`, and `method_params` filled in, every method of `methods` (and any other
    section given) with every key of its `Config` at its effective value, the given ones over
    the defaults; so a params file states only what it changes. A method without keys has no
    section. An unknown method in `method_params`, or an unknown or invalid key, is a
    ParamsError naming it (an unknown entry of `methods` is left to `kbench.design`)."""
    methods = all_methods() if params.methods == ALL_METHODS else list(params.methods)
    unknown = [name for name in params.method_params if name not in _METHODS]
    if unknown:
        raise ParamsError(f"key 'method_params': unknown method(s) {unknown}; registered: {method_names()}")
    filled: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys([*methods, *params.method_params]):
        if name in _METHODS and (section := _validated(name, params.method_params.get(name) or {}).model_dump(mode="json")):
            filled[name] = section
    return params.model_copy(update={"methods": methods, "method_params": filled})


def build_method(name: str, context: MethodContext) -> Method:
    return method_class(name)(context)
