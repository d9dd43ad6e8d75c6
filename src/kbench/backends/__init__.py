"""Model backends; importing this package registers the built-in ones."""

from kbench.backends import hf, llama_cpp, openai  # noqa: F401  (registration side effect)
from kbench.backends.base import (
    Backend,
    BackendError,
    Conversation,
    Generation,
    KVSession,
    KVSessions,
    Message,
    Request,
    backend_has_weights,
    backend_is_remote,
    backend_names,
    backend_serves_adapters,
    build_backend,
    register_backend,
)

__all__ = [
    "Backend",
    "BackendError",
    "Conversation",
    "Generation",
    "KVSession",
    "KVSessions",
    "Message",
    "Request",
    "backend_has_weights",
    "backend_is_remote",
    "backend_names",
    "backend_serves_adapters",
    "build_backend",
    "register_backend",
]
