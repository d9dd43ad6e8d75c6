"""The import graph of the `kbench` package, read from the source (no import is executed).

Used by the structure tests: the DVC dependencies of a stage must cover the import closure
of its entry point, and no two `kbench` modules may import each other in a cycle.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "kbench"


def module_file(module: str) -> Path | None:
    """The source file of a `kbench` module or package, or None if there is none."""
    base = SRC.joinpath(*module.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parents(module: str) -> list[str]:
    """The packages Python initialises before `module` (kbench, kbench.x, ...)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, top_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """Import statements: every one, or only those run when the module loads (module level,
    `if`/`try` blocks included, `if TYPE_CHECKING:` excluded)."""
    if not top_level:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found: list[ast.Import | ast.ImportFrom] = []
    stack = list(getattr(tree, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [h for x in node.handlers for h in x.body]
    return found


def _imported(node: ast.Import | ast.ImportFrom, current: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        anchor = current.split(".") if is_package else current.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


@lru_cache(maxsize=None)
def kbench_imports(module: str, top_level: bool = True) -> frozenset[str]:
    """The `kbench` modules `module` imports directly (submodules named by `from x import y` too)."""
    path = module_file(module)
    if path is None:
        return frozenset()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in _import_nodes(tree, top_level):
        for name in _imported(node, module, path.name == "__init__.py"):
            if (name == PACKAGE or name.startswith(PACKAGE + ".")) and module_file(name) is not None:
                found.add(name)
    return frozenset(found - {module})


def script_imports(script: Path) -> frozenset[str]:
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names = {n for node in _import_nodes(tree, False) for n in _imported(node, "__main__", False)}
    return frozenset(n for n in names if n.startswith(PACKAGE) and module_file(n) is not None)


def closure(modules: frozenset[str]) -> set[str]:
    """Every `kbench` module loaded when `modules` are imported (parent packages included)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += _parents(module)
        todo += kbench_imports(module, top_level=False)
    return seen


def all_modules() -> list[str]:
    return sorted(module_name(p) for p in (SRC / PACKAGE).rglob("*.py"))


def find_cycle(top_level: bool = True) -> list[str] | None:
    """One import cycle between `kbench` modules (a list ending where it starts), or None."""
    graph = {m: sorted(kbench_imports(m, top_level)) for m in all_modules()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in graph.get(module, []):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in graph:
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


#: Packages whose modules a stage names one by one (their `__init__` imports nothing, and
#: each stage needs one module of them); any other package is named as a whole folder.
ENTRY_PACKAGES = ("kbench.cli", "kbench.stages")


def code_deps(modules: set[str]) -> list[str]:
    """The DVC dependency paths (relative to the repo root) that cover `modules`' files."""
    deps = set()
    for module in modules:
        path = module_file(module)
        parts = module.split(".")
        package = ".".join(parts[:2])
        if len(parts) >= 2 and package not in ENTRY_PACKAGES and (SRC.joinpath(*parts[:2]) / "__init__.py").exists():
            deps.add(SRC.joinpath(*parts[:2]).relative_to(ROOT).as_posix())
        else:
            deps.add(path.relative_to(ROOT).as_posix())
    return sorted(deps)


def covered(path: str, deps: list[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)
