"""Unlearning methods; importing this package registers the built-in ones."""

from kbench.methods import none  # noqa: F401  (registration side effect)
from kbench.methods.base import (
    ALL_SUBSTRATES,
    Hook,
    Method,
    MethodContext,
    MethodError,
    build_method,
    method_names,
    register_method,
    unregister_method,
)

__all__ = [
    "ALL_SUBSTRATES",
    "Hook",
    "Method",
    "MethodContext",
    "MethodError",
    "build_method",
    "method_names",
    "register_method",
    "unregister_method",
]
