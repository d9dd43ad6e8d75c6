"""An operator is one file: a module of the user's own, outside src/kbench/replay/operators,
named in an entry point of the `kbench.operators` group, is listed after the built-in ones and
runs on a session beside them, with no file of the project changed (docs/replay.md, "Adding an
operator")."""

from __future__ import annotations

import re

import pytest
from _plugins import docs_example, fresh_list, plugin_fixtures
from _agent_fixtures import small_corpus, tiny_model_dir  # noqa: F401  (fixtures)

from kbench.replay import SessionEnvironment, plan_suite
from kbench.replay.operators import (
    ENTRY_POINT_GROUP,
    OperatorError,
    build_operator,
    load_plugins,
    operator_class,
    operator_names,
    register_operator,
    unregister_operator,
)
from kbench.replay.records import OPERATOR_ID_LENGTH, OPERATORS, SessionRecord, read_sessions, write_sessions


#: The operator of docs/replay.md's how-to ("Adding an operator"), as a user writes it: one module.
SOURCE = docs_example("replay.md", "### Adding an operator")
NAME, TITLE = re.search(r'@register_operator\("([^"]+)", "([^"]+)"\)', SOURCE).groups()
MODULE = "kbench_docs_operator_" + NAME.lower()


#: The user's project, installed (`plugin_path`), and the plugin loaded in this process (`plugin`).
plugin_path, plugin = plugin_fixtures(MODULE, SOURCE, ENTRY_POINT_GROUP, TITLE, load_plugins,
                                      lambda: unregister_operator(NAME))


def test_a_user_operator_is_listed_by_a_fresh_kbench_after_the_built_in_ones(plugin_path):
    """The way a user runs it: the module is on the path (installed), kbench finds it."""
    rows = fresh_list(plugin_path, "operators")
    assert [row["name"] for row in rows] == [*OPERATORS, NAME]
    assert rows[-1]["title"] == TITLE
    assert rows[-1]["description"] == re.search(r'class \w+\(Operator\):\n\s+"""(.+?)"""', SOURCE)[1]


def test_a_user_operator_is_built_by_name_and_sorted_after_the_papers(plugin):
    assert operator_names() == [*OPERATORS, NAME]
    operator = build_operator(NAME)
    assert type(operator) is operator_class(NAME) and operator.id == NAME and operator.title == TITLE


def test_a_user_operator_runs_on_a_session_beside_the_built_in_ones(plugin, small_corpus, tiny_model_dir,  # noqa: F811
                                                                    tmp_path):
    """On the KV engine of the hf backend: its rebuild's prefill is its own cost, and its record
    is written and read back like the others'."""
    from kbench.backends import build_backend
    from kbench.config import AgentConfig, ModelConfig
    from kbench.replay.run import run_session

    backend = build_backend(ModelConfig(path=str(tiny_model_dir)))
    (plan,) = plan_suite(small_corpus, sessions=1, kind="tool", T=4, tau=2, indep=0.5, n_post=4, seed=0)
    env = SessionEnvironment(small_corpus, source=(plan.target_entity, plan.target_field))
    result = run_session(backend, env, plan, AgentConfig(max_iters=2, max_new_tokens=8), operators=["B0", "B5", NAME],
                         compression_period=0)
    by = {r.operator: r for r in result.records}
    assert list(by) == ["B0", "B5", NAME]
    assert by[NAME].transitions == 0 and by[NAME].recomputed_tokens > 0  # a prefill, no agent turn
    assert by[NAME].final_state_sha256 != by["B0"].final_state_sha256  # its prompt holds no turn
    assert read_sessions([write_sessions(tmp_path / "sessions.jsonl", result.records)]) == result.records


def test_an_operator_id_is_any_short_non_empty_string():
    for bad in ("", "X" * (OPERATOR_ID_LENGTH + 1)):
        with pytest.raises(OperatorError, match="must have 1 to"):
            register_operator(bad, "bad")
    with pytest.raises(OperatorError, match="'B1' is already registered"):
        register_operator("B1", "again")(type("Again", (operator_class("B1"),), {}))
    assert operator_class("B1").title == "memory-delete"
    record = {"session_id": "s", "suite": "kbench-sessions", "operator": NAME, "target": "z", "tau": 1, "T": 1,
              "transitions": 0, "recomputed_tokens": 0, "seconds": 0, "post": [], "probes": {},
              "final_state_sha256": "0" * 64}
    assert SessionRecord.model_validate(record).operator == NAME
    for bad in ("", "X" * (OPERATOR_ID_LENGTH + 1)):
        with pytest.raises(ValueError, match="operator"):
            SessionRecord.model_validate({**record, "operator": bad})
