"""`kbench list KIND`: what is registered (methods, substrates, backends), the probes and the
presets, as an aligned table or, with `--json`, a JSON list of objects in a fixed key order.

Each row comes from where the thing is defined: a registry, `kbench.probes.summary.PROBES`,
or a preset file's first comment line; nothing is listed twice by hand.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kbench.backends import backend_names
from kbench.backends.base import _BACKENDS  # the registry itself: its classes carry the docstrings
from kbench.cli.project import preset_paths
from kbench.methods import method_class, method_names
from kbench.probes.summary import PROBES
from kbench.forms import form_class, form_names
from kbench.memory.systems import memory_system_class, memory_system_names
from kbench.observer.matcher import scoring_rule, scoring_rule_names
from kbench.replay.operators import operator_class, operator_names
from kbench.replay.suites import suite_kind, suite_names
from kbench.substrates import substrate_class, substrate_names

#: The title of this command in `kbench --help`.
GROUP = "project tools"
#: What an empty cell of the table shows.
EMPTY = "-"
#: The longest description the table shows (`--json` gives it whole).
TABLE_DESCRIPTION = 90


def _summary(cls: type) -> str:
    """A one-line description of a registered class: the first line of its own docstring, else
    the first sentence of its module's docstring (without a leading "`name`: " or "`name` (...): ")."""
    own = cls.__dict__.get("__doc__")
    if own and own.strip():
        return inspect.cleandoc(own).splitlines()[0]
    module = sys.modules.get(cls.__module__)
    paragraph = " ".join(inspect.cleandoc(getattr(module, "__doc__", None) or "").split("\n\n")[0].split())
    sentence = _SENTENCE_END.split(paragraph, maxsplit=1)[0]
    return _NAME_PREFIX.sub("", sentence)


#: A sentence's end: a full stop before a capital ("et al. 2024" does not end one).
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])\. (?=[A-Z`])")
#: A module docstring's leading "`name`: " or "`name` (citation): ".
_NAME_PREFIX = re.compile(r"^`[^`]+`(?: \([^)]*\))?: ")


def list_methods() -> list[dict[str, Any]]:
    """Every registered method: its family (when the method declares one), the substrates it
    acts on and what it does."""
    rows = []
    for name in method_names():
        cls = method_class(name)
        rows.append({"name": name, "family": getattr(cls, "family", None), "substrates": sorted(cls.substrates),
                     "description": _summary(cls)})
    return rows


def list_substrates() -> list[dict[str, Any]]:
    """Every registered substrate and where it keeps the target."""
    return [{"name": name, "description": _summary(substrate_class(name))} for name in substrate_names()]


def list_backends() -> list[dict[str, Any]]:
    """Every registered model backend and whether it has weights a method may edit or hook."""
    return [{"name": name, "weights": _BACKENDS.get(name).has_weights, "description": _summary(_BACKENDS.get(name))}
            for name in backend_names()]


def list_probes() -> list[dict[str, Any]]:
    """The direct-elicitation probes, each with the score its "clean" verdict reads (docs/probes.md)."""
    return [{"name": name, "score": score} for name, score in PROBES.items()]


def list_operators() -> list[dict[str, Any]]:
    """The execution-state lane's forget operators (docs/replay.md)."""
    return [{"name": name, "title": operator_class(name).title, "description": _summary(operator_class(name))}
            for name in operator_names()]


def list_suites() -> list[dict[str, Any]]:
    """The execution-state lane's session suites and how z enters each."""
    def describe(name: str) -> str:
        if name.startswith("agentdojo-"):
            return "AgentDojo's suite (PyPI agentdojo): its user tasks and tools; z in a tool return via its injection placeholders"
        return ("z enters through a lookup's observation" if suite_kind(name) == "tool"
                else "z enters through the user's memory injection")

    return [{"name": name, "kind": suite_kind(name), "description": describe(name)} for name in suite_names()]


def list_memory_systems() -> list[dict[str, Any]]:
    """The memory lane's systems (`memory.systems`; docs/memory.md), each with whether it makes
    its own LLM calls to an endpoint (Mem0 does)."""
    return [{"name": name, "endpoint": memory_system_class(name).needs_endpoint,
             "description": _summary(memory_system_class(name))} for name in memory_system_names()]


def list_rules() -> list[dict[str, Any]]:
    """The matcher's scoring rules (`scoring.rule`; docs/definitions.md): which surface forms of a
    ground truth count as a disclosure."""
    return [{"name": name, "description": scoring_rule(name).description} for name in scoring_rule_names()]


def list_forms() -> list[dict[str, Any]]:
    """The query forms of the ladder (`queries.forms`; docs/definitions.md)."""
    return [{"name": name, "asks": form_class(name).title, "adaptive": form_class(name).adaptive}
            for name in form_names()]


def list_presets() -> list[dict[str, Any]]:
    """The presets in presets/, each described by its file's first comment line."""
    return [{"name": name, "path": path.as_posix(), "description": _first_comment(path)}
            for name, path in preset_paths().items()]


def _first_comment(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


#: `kbench list KIND`: each kind's rows, in the order of the help.
KINDS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "methods": list_methods,
    "substrates": list_substrates,
    "probes": list_probes,
    "presets": list_presets,
    "backends": list_backends,
    "operators": list_operators,
    "suites": list_suites,
    "memory-systems": list_memory_systems,
    "forms": list_forms,
    "rules": list_rules,
}


def _cell(value: Any) -> str:
    if value is None or value == []:
        return EMPTY
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """`rows` as columns aligned under an upper-case header (the last column is not padded)."""
    if not rows:
        return "(none)"
    keys = list(rows[0])
    cells = [[key.upper() for key in keys], *([_cell(row[key]) for key in keys] for row in rows)]
    if keys[-1] == "description":
        for line in cells[1:]:
            if len(line[-1]) > TABLE_DESCRIPTION:
                line[-1] = line[-1][: TABLE_DESCRIPTION - 3].rstrip() + "..."
    widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def cmd_list(args: argparse.Namespace) -> int:
    """Print the rows of one kind: a table, or a JSON list with `--json`."""
    lister = KINDS.get(args.kind)
    if lister is None:
        raise ValueError(f"unknown kind {args.kind!r}; known kinds: {', '.join(KINDS)}")
    rows = lister()
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help=f"list the registered {', '.join(KINDS)} (--json: machine-readable)")
    p.add_argument("kind", metavar="KIND", help=f"what to list: {', '.join(KINDS)}")
    p.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")
    p.set_defaults(handler=cmd_list)
