"""The code's shape: no import cycles, kbench imports at the top, DVC dependencies that follow
the imports, registered names defined once, and one set of defaults."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from _imports import ROOT, SRC, all_modules, closure, covered, find_cycle, module_file, script_imports

from kbench.backends import backend_names
from kbench.config import ALL_METHODS, Params
from kbench.design import load_design
from kbench.methods import FAMILIES, all_methods, method_class, method_config, method_names
from kbench.names import ANSWER_RULES
from kbench.observer.matcher import scoring_rule_names
from kbench.substrates import substrate_names

#: The module that defines the names the core refers to.
NAMES_MODULE = "kbench.names"


def test_no_import_cycle_between_kbench_modules():
    assert find_cycle(top_level=True) is None
    assert find_cycle(top_level=False) is None  # function-local imports would not hide one either


def test_kbench_imports_are_at_the_top_of_every_module():
    local = []
    for module in all_modules():
        tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kbench"):
                    local.append(f"{module}.{function.name}: from {node.module} import ...")
                elif isinstance(node, ast.Import) and any(a.name.startswith("kbench") for a in node.names):
                    local.append(f"{module}.{function.name}: import {node.names[0].name}")
    assert local == []


def _dvc_stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_every_stage_depends_on_the_code_it_imports():
    stages = _dvc_stages()
    assert stages, "dvc.yaml has no stages"
    for name, stage in stages.items():
        script = next(word for word in stage["cmd"].split() if word.startswith("pipelines/"))
        deps = [d for d in stage["deps"] if isinstance(d, str)]
        assert script in deps, f"stage {name} does not depend on its entry point {script}"
        loaded = closure(script_imports(ROOT / script))
        assert "kbench" in loaded and len(loaded) > 3, f"stage {name}: {script} imports no kbench code"
        missing = sorted(
            path for path in (module_file(m).relative_to(ROOT).as_posix() for m in loaded) if not covered(path, deps)
        )
        assert missing == [], f"dvc.yaml stage {name} misses dependencies it imports: {missing}"


def test_the_closure_check_sees_a_missing_dependency():
    loaded = closure(script_imports(ROOT / "pipelines/cell.py"))
    files = [module_file(m).relative_to(ROOT).as_posix() for m in loaded]
    assert "src/kbench/observer/matcher.py" in files and "src/kbench/records.py" in files
    assert not covered("src/kbench/observer/matcher.py", ["src/kbench/observe", "src/kbench/records.py"])
    assert covered("src/kbench/observer/matcher.py", ["src/kbench/observer"])


def _registered() -> set[str]:
    return {*backend_names(), *substrate_names(), *method_names(), *scoring_rule_names(), *ANSWER_RULES}


def _string_constants(tree: ast.Module) -> list[tuple[int, str]]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_registered_names_are_written_once():
    """A registered name appears as a string literal only in kbench.names or the module that
    registers it under its own name (a plug-in)."""
    registered = _registered()
    assert {"P", "C", "R-text", "R-struct", "none", "gold", "hf", "field-aware", "strict", "spec", "lenient"} <= registered
    repeated = []
    for module in all_modules():
        if module == NAMES_MODULE:
            continue
        tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
        constants = _string_constants(tree)
        own = {
            value for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "").startswith("register_")
            for arg in node.args[:1] if isinstance(arg, ast.Constant) for value in [arg.value]
        }
        repeated += [f"{module}:{line} {value!r}" for line, value in constants if value in registered - own]
    assert repeated == []


def test_the_names_module_names_only_registered_entries():
    from kbench import names

    registered = _registered()
    for constant in ("PARAMETRIC", "CONTEXT", "TEXT_RETRIEVAL", "STRUCT_RETRIEVAL", "BASELINE_METHOD", "GOLD_METHOD", "HF_BACKEND",
                     "FIELD_AWARE_RULE", "STRICT_RULE", "SPEC_ANSWER_RULE", "LENIENT_ANSWER_RULE"):
        assert getattr(names, constant) in registered, constant


#: Keys the CPU default sets beyond the code defaults: the method grid (`all`: every registered
#: method) and each method's section (filled in from its `Config` when the design is loaded).
_GRID_KEYS = {"methods", "method_params"}


@pytest.mark.parametrize("path", ["params.yaml", "presets/cpu.yaml"])
def test_the_cpu_default_params_are_the_code_defaults(path):
    params = load_design(ROOT / path)
    assert params.model_dump(exclude=_GRID_KEYS) == Params().model_dump(exclude=_GRID_KEYS)
    assert params.methods == all_methods()  # every method is in the default grid
    for name in method_names():
        config = method_config(name, params)
        assert config == type(config)(), f"method_params.{name} differs from its Config's defaults"
        # `kbench params --show` prints every key of every method's section.
        assert set(params.method_params.get(name, {})) == set(type(config).model_fields), name


@pytest.mark.parametrize("path", ["params.yaml", "presets/cpu.yaml", "presets/cpu-full.yaml", "presets/paper.yaml"])
def test_a_params_file_states_only_what_differs_from_a_methods_defaults(path):
    """A method is one file: no params file repeats its defaults, so a new method or a new
    default changes no params file."""
    written = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    assert written["methods"] == ALL_METHODS, f"{path} must run every registered method (methods: all)"
    for name, section in written["method_params"].items():
        defaults = method_class(name).Config().model_dump(mode="json")
        given = method_class(name).Config.model_validate(section).model_dump(mode="json")
        repeated = sorted(key for key in section if given[key] == defaults[key])
        assert repeated == [], f"{path}: method_params.{name} repeats the default of {repeated}"


def test_every_built_in_method_declares_its_family_order_and_summary():
    orders = [method_class(name).order for name in method_names()]
    assert None not in orders and len(set(orders)) == len(orders)
    for name in method_names():
        cls = method_class(name)
        assert cls.family in FAMILIES, name
        doc = cls.__dict__.get("__doc__") or ""
        assert doc.strip() and len(doc.strip().splitlines()[0]) <= 100, f"{name}: a one-line docstring summary"


def test_every_package_has_a_public_init():
    for package in sorted(p.parent for p in (SRC / "kbench").rglob("__init__.py")):
        text = (package / "__init__.py").read_text(encoding="utf-8")
        assert ast.get_docstring(ast.parse(text)), f"{package} has no package docstring"
