"""The model backend interface and its registry.

A backend turns a batch of chat conversations into a batch of continuations. The agent
harness only needs that; methods that edit weights or install forward hooks also need the
model and tokenizer, which only some backends have (`has_weights`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypedDict

from kbench.config import ModelConfig
from kbench.registry import Registry


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant"
    content: str


Conversation = list[Message]


@dataclass(frozen=True)
class Generation:
    """One continuation. `reasoning` is reasoning text an endpoint returned beside the reply."""

    text: str
    reasoning: str | None = None


@dataclass(frozen=True)
class Request:
    """What one `generate` call asks of a backend besides its conversations."""

    #: Strings that end a continuation (the returned text excludes them); the end of the
    #: assistant turn always ends it.
    stop: tuple[str, ...]
    #: The most tokens one continuation may have.
    max_new_tokens: int
    #: One per conversation, from `Backend.session`: what a backend keeps between one
    #: sequence's calls, such as its KV cache; None: nothing is kept.
    sessions: Sequence[Any] | None = None
    #: Whether the backend may reuse work across conversations that start alike.
    share_prefixes: bool = True


class KVSession(Protocol):
    """One sequence's KV cache (`KVSessions.open`; the hf backend's `kbench.backends.engine.KVState`):
    cut back, saved, restored and forked without copying the cache."""

    #: The token ids whose keys and values it holds, in order.
    tokens: list[int]

    @property
    def length(self) -> int:
        """How many tokens it holds."""

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens."""

    def checkpoint(self) -> Any:
        """A handle of the cache as it is now (a `tokens` attribute and references: nothing copied)."""

    def restore(self, checkpoint: Any) -> None:
        """Hold what `checkpoint` held."""

    def fork(self) -> KVSession:
        """A session of its own holding the same cache (shared, never rewritten)."""


class KVSessions(Protocol):
    """The KV-cache operations the execution-state lane runs on (`Backend.kv_sessions`;
    docs/replay.md): sessions opened, prefilled and decoded from, with the prompts' token ids and
    the tokens fed so far. A session computes from its own cache only, never from a prefix shared
    with another session, so a replay does the first run's arithmetic."""

    def open(self) -> KVSession:
        """A fresh, empty session."""

    def encode(self, conversation: Conversation) -> list[int]:
        """The prompt's token ids (the chat template with the assistant turn opened)."""

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of generated token ids, special tokens left out."""

    def prefill(self, sessions: Sequence[KVSession], prompts: Sequence[Sequence[int]]) -> None:
        """Make each session hold its prompt, computing only what it does not hold already."""

    def generate(self, sessions: Sequence[KVSession], prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 stop: Sequence[str], choose: Callable[[int, Any], int] | None = None) -> list[list[int]]:
        """Each prompt's continuation (token ids, end of turn excluded) from its session, which
        then holds the prompt and the continuation; `choose(row, logits)` picks each token (greedy: None)."""

    def tokens_fed(self) -> int:
        """Tokens fed through the model so far, prefill and decode."""

    def retained_bytes(self, checkpoints: Sequence[Any], live: Sequence[KVSession | None]) -> int:
        """Bytes of cache storage the `checkpoints` keep alive beyond the `live` sessions'."""


class BackendError(ValueError):
    """A backend cannot be built or cannot serve a request."""


class Backend(ABC):
    """Generates greedy continuations for a batch of conversations.

    `stop` strings end a continuation (the returned text excludes them); the end of the
    assistant turn always ends it.
    """

    name: ClassVar[str]
    #: True when `model` and `tokenizer` are real torch objects a method may edit or hook.
    has_weights: ClassVar[bool]
    #: True when the model is a server's at `model.base_url`; False when `model.path` names local files.
    remote: ClassVar[bool] = False
    #: True when the server applies a LoRA adapter per request, by the name it serves it under
    #: (vLLM's `--lora-modules`): `load_adapter` chooses that name instead of loading weights.
    serves_adapters: ClassVar[bool] = False

    def generate(
        self,
        conversations: Sequence[Conversation],
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        sessions: Sequence[Any] | None = None,
        share_prefixes: bool = True,
    ) -> list[Generation]:
        """Continuations of `conversations` (the options: `Request`)."""
        return self._generate(conversations, Request(tuple(stop), max_new_tokens, sessions, share_prefixes))

    @abstractmethod
    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        """What a backend implements: the continuations of `conversations` under `request`."""

    def session(self) -> Any | None:
        """What the backend keeps for one trajectory across its calls (None: nothing)."""
        return None

    def kv_sessions(self) -> KVSessions | None:
        """The KV-cache operations on its sessions that the execution-state lane runs on (None:
        the backend has no KV engine)."""
        return None

    def load_adapter(self, path: str, *, merge: bool = False) -> None:
        raise BackendError(f"the {self.name} backend cannot load a LoRA adapter ({path})")

    @property
    def model(self) -> Any:
        raise BackendError(f"the {self.name} backend exposes no model weights")

    @property
    def tokenizer(self) -> Any:
        raise BackendError(f"the {self.name} backend exposes no tokenizer")


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut `text` at the earliest stop string (stop strings may be generated mid-token)."""
    cut = len(text)
    for marker in stop:
        index = text.find(marker)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


BackendFactory = Callable[[ModelConfig], Backend]
_BACKENDS: Registry[BackendFactory] = Registry("backend", BackendError)


def register_backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    def decorate(cls: type[Backend]) -> type[Backend]:
        cls.name = name
        _BACKENDS.add(name, cls)
        return cls

    return decorate


def backend_names() -> list[str]:
    return _BACKENDS.names()


def backend_has_weights(name: str) -> bool:
    """Whether the backend registered as `name` exposes weights a method may edit or hook."""
    return _BACKENDS.get(name).has_weights


def backend_is_remote(name: str) -> bool:
    """Whether the backend registered as `name` talks to a server at `model.base_url`."""
    return _BACKENDS.get(name).remote


def backend_serves_adapters(name: str) -> bool:
    """Whether the backend registered as `name` reaches LoRA adapters a server applies by name."""
    return _BACKENDS.get(name).serves_adapters


def build_backend(config: ModelConfig) -> Backend:
    """The backend named by `config.backend`, built from the model section of params."""
    return _BACKENDS.get(config.backend)(config)
