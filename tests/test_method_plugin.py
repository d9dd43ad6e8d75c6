"""A method is one file: a module of the user's own, outside src/kbench/methods, named in an
entry point of the `kbench.methods` group, is listed, has its params section validated and
filled, and runs in a cell, with no file of the project changed (docs/methods.md, "Adding a
method")."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import yaml
from _plugins import fresh_list, plugin_fixtures
from _agent_fixtures import index_dir, small_corpus, tiny_model_dir  # noqa: F401  (fixtures)

from kbench.cli.main import main
from kbench.config import ParamsError, parse_params
from kbench.design import check_design
from kbench.methods import ENTRY_POINT_GROUP, all_methods, load_plugins, method_class, method_names, unregister_method

from conftest import REPO

#: The method of docs/methods.md's how-to ("Adding a method"), as a user writes it: one module.
SOURCE = textwrap.dedent(re.search(r"```python\n(.*?)```", (REPO / "docs/methods.md").read_text(encoding="utf-8"),
                                   re.S)[1])
NAME = re.search(r'@register_method\("([^"]+)"', SOURCE)[1]
MODULE = "kbench_docs_" + NAME.replace("-", "_")


#: The user's project, installed (`plugin_path`), and the plugin loaded in this process (`plugin`).
plugin_path, plugin = plugin_fixtures(MODULE, SOURCE, ENTRY_POINT_GROUP, NAME, load_plugins,
                                      lambda: unregister_method(NAME))


def method_class_family(source: str) -> str:
    """The family the module's decorator declares."""
    return re.search(r'family="([^"]+)"', source)[1]


def test_a_user_method_is_listed_by_a_fresh_kbench(plugin_path):
    """The way a user runs it: the module is on the path (installed), kbench finds it."""
    rows = {row["name"]: row for row in fresh_list(plugin_path, "methods")}
    assert rows[NAME]["family"] == method_class_family(SOURCE)
    assert rows[NAME]["description"] == re.search(r'class \w+\(Method\):\n\s+"""(.+?)"""', SOURCE)[1]
    assert set(rows) - {NAME} == set(method_names())  # the built-in ones, unchanged


def test_a_user_method_joins_the_default_grid_after_the_built_in_ones(plugin):
    assert NAME in method_names() and method_class(NAME).family == method_class_family(SOURCE)
    assert all_methods()[-1] == NAME  # no declared order: after every method that declares one
    assert check_design(parse_params({"methods": "all"})).methods == all_methods()


def test_a_user_methods_section_is_filled_and_checked(plugin):
    assert check_design(parse_params({"methods": ["none", NAME]})).method_params[NAME] == {"reply": "Withheld."}
    params = check_design(parse_params({"methods": ["none", NAME], "method_params": {NAME: {"reply": "No."}}}))
    assert params.method_params[NAME] == {"reply": "No."}
    with pytest.raises(ParamsError, match=f"unknown key 'method_params.{NAME}.volume'"):
        check_design(parse_params({"methods": ["none", NAME], "method_params": {NAME: {"volume": 3}}}))


def test_a_user_method_runs_in_a_cell(plugin, kbench_root, tiny_model_dir, small_corpus, index_dir, capsys):  # noqa: F811
    from kbench.corpus import write_corpus

    corpus_dir = kbench_root / "corpus"
    write_corpus(small_corpus, corpus_dir)
    params_file = kbench_root / "params.yaml"
    params_file.write_text(yaml.safe_dump({
        "model": {"path": str(tiny_model_dir)},
        "agent_base": {"enabled": False},
        "agent": {"max_iters": 2, "max_new_tokens": 8, "summary_max_new_tokens": 8, "batch_size": 4},
        "queries": {"n_per_split": 2, "forms": []},
        "substrates": ["R-struct"],
        "methods": ["none", NAME],
        "method_params": {NAME: {"reply": "Nothing to say."}},
    }))
    assert main(["--params", str(params_file), "cell", "--substrate", "R-struct", "--seed", "0", "--method", NAME,
                 "--corpus", str(corpus_dir), "--index", str(index_dir), "--no-progress", "--no-track",
                 "--out-root", "cells"]) == 0, capsys.readouterr().err
    folder = kbench_root / f"cells/R-struct__s0/{NAME}/none"
    records = [json.loads(line) for line in (folder / "traces.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["method"] for r in records} == {NAME}
    assert {r["answer"] for r in records} == {"Nothing to say."}
    inputs = json.loads((folder / "inputs.json").read_text())
    assert inputs["method_params"] == {"reply": "Nothing to say."}
