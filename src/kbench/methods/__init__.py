"""Unlearning methods; importing this package registers every method module in it.

A method is one module here with one `@register_method` class: it is found by scanning the
package, so adding a method touches no other file.
"""

import importlib
import pkgutil

from kbench.methods.base import (
    ALL_SUBSTRATES,
    Fitted,
    Hook,
    Method,
    MethodConfig,
    MethodContext,
    MethodError,
    build_method,
    method_class,
    method_config,
    method_names,
    register_method,
    unregister_method,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in {"base", "activation", "fitting", "residual", "unlearning"}:  # the interface and shared helpers
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ALL_SUBSTRATES",
    "Fitted",
    "Hook",
    "Method",
    "MethodConfig",
    "MethodContext",
    "MethodError",
    "build_method",
    "method_class",
    "method_config",
    "method_names",
    "register_method",
    "unregister_method",
]
