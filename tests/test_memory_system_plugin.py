"""A memory system is one file: a module of the user's own, outside src/kbench/memory/systems,
named in an entry point of the `kbench.memory_systems` group, is listed and runs on an instance,
with no file of the project changed (docs/memory.md, "Adding a memory system")."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date

import pytest
from _plugins import docs_example, fresh_list, plugin_fixtures
from _agent_fixtures import small_corpus  # noqa: F401  (fixture)

from kbench.backends import Backend, Conversation, Generation
from kbench.backends.base import Request
from kbench.memory.instances import make_instances
from kbench.memory.systems import (
    ENTRY_POINT_GROUP,
    MemorySystemError,
    load_plugins,
    memory_system_class,
    memory_system_names,
    run_instance,
    unregister_memory_system,
)


#: The system of docs/memory.md's how-to ("Adding a memory system"), as a user writes it: one module.
SOURCE = docs_example("memory.md", "### Adding a memory system")
NAME = re.search(r'@register_memory_system\("([^"]+)"\)', SOURCE)[1]
MODULE = "kbench_docs_memory_" + NAME.replace("-", "_")


class LastLineBackend(Backend):
    """Replies with the last line of each prompt's system message (what the system put last)."""

    name, has_weights = "last-line", False

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        return [Generation(c[0]["content"].splitlines()[-1]) for c in conversations]


#: The user's project, installed (`plugin_path`), and the plugin loaded in this process (`plugin`).
plugin_path, plugin = plugin_fixtures(MODULE, SOURCE, ENTRY_POINT_GROUP, NAME, load_plugins,
                                      lambda: unregister_memory_system(NAME))


def test_a_user_memory_system_is_listed_by_a_fresh_kbench(plugin_path):
    """The way a user runs it: the module is on the path (installed), kbench finds it."""
    rows = {row["name"]: row for row in fresh_list(plugin_path, "memory-systems")}
    assert rows[NAME]["endpoint"] is False
    assert rows[NAME]["description"] == re.search(r'class \w+\(MemorySystem\):\n\s+"""(.+?)"""', SOURCE)[1]
    assert set(rows) - {NAME} == set(memory_system_names())  # the built-in ones, unchanged


def test_a_user_memory_system_runs_on_an_instance(plugin, small_corpus):  # noqa: F811
    assert NAME in memory_system_names()
    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    run = run_instance(lambda: memory_system_class(NAME)(LastLineBackend()), instance)
    assert len(run.items) == len(run.traces) == len(instance.probes) and {i.system for i in run.items} == {NAME}
    assert run.failures == 0
    for version, kept in run.memories.items():  # what it keeps: the user's last turns, dated
        assert kept and all(line.startswith("[") for line in kept.splitlines()), version
    last_turns = {kept.splitlines()[-1] for kept in run.memories.values()}
    assert {i.reply for i in run.items} <= {f"- {line}" for line in last_turns}  # each reply: the prompt's last line


def test_an_unknown_system_is_answered_with_the_registered_ones_plugins_included(plugin):
    with pytest.raises(MemorySystemError, match=f"registered: .*'{NAME}'"):
        memory_system_class("no-such-system")
