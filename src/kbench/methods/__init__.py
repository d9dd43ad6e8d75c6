"""Unlearning methods; importing this package registers every method there is.

A method is one module with one `@register_method` class, found in one of two ways, so adding
a method touches no other file (docs/methods.md, "Adding a method"):

- a module in this package: found by scanning it;
- a module of your own project: named in an entry point of the group `kbench.methods` of an
  installed distribution (`[project.entry-points."kbench.methods"]` in its pyproject.toml,
  `my-method = "my_package.my_method"`); it is imported after the package's own methods.
"""

from kbench.methods.base import (
    ALL_SUBSTRATES,
    FAMILIES,
    Fitted,
    Hook,
    Method,
    MethodConfig,
    MethodContext,
    MethodError,
    all_methods,
    build_method,
    resolve_methods,
    method_class,
    method_config,
    method_names,
    register_method,
    unregister_method,
)
from kbench.registry import import_entry_points, import_submodules

#: The entry-point group a distribution names its method modules in.
ENTRY_POINT_GROUP = "kbench.methods"

# every method module but the interface and the shared helpers
import_submodules(__name__, __path__, skip={"base", "activation", "fitting", "residual", "unlearning"})


def load_plugins() -> list[str]:
    """Import every module named in the `kbench.methods` entry points (in name order), which
    registers its methods; returns the modules imported. Run once when this package loads;
    calling it again imports nothing new."""
    return import_entry_points(ENTRY_POINT_GROUP)


load_plugins()

__all__ = [
    "ALL_SUBSTRATES",
    "ENTRY_POINT_GROUP",
    "FAMILIES",
    "Fitted",
    "Hook",
    "Method",
    "MethodConfig",
    "MethodContext",
    "MethodError",
    "all_methods",
    "build_method",
    "resolve_methods",
    "load_plugins",
    "method_class",
    "method_config",
    "method_names",
    "register_method",
    "unregister_method",
]
