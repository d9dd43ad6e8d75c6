"""One module per DVC stage (`dvc.yaml`): corpus, index, agent_base, inject, fit, unlearn, probes, cell, replay,
memory_instances, memory, memory_report, compare.

Each stage module has `COMMAND` (its `kbench` subcommand), `HELP` (its line in `kbench --help`),
`Options` (a frozen dataclass, one field per command-line option, each made with `option`) and
`main(params, options) -> int`, a plain function of the loaded design and typed options;
`kbench.cli` parses the command line into `Options` and calls `main`. The work itself is
`run_<stage>_stage(params, ...)`, callable from Python without any command line. Every lane's
unit of work (a cell, a replay suite, a memory system) runs through one skeleton, `kbench.stages.unit`:
its resume check, its finished parts, its worker's model and its MLflow run.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option(default: Any, help: str, *, choices: Any = None, metavar: str | None = None) -> Any:
    """A field of a stage's `Options`: its default and its command-line help (`--field-name`;
    a bool defaulting to True is offered as `--no-field-name`, a tuple as a repeatable option)."""
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar})


def track_option() -> Any:
    """The `--no-track` option of a stage that records its outputs as MLflow runs."""
    return option(True, "do not log an MLflow run")
