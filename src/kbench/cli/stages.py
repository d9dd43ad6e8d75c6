"""Pipeline subcommands: the command of every DVC stage, which lives beside its stage in
`kbench.stages` (corpus, index, agent-base, inject, fit, unlearn, probes, cell, replay-run, memory-instances,
memory-run, memory-report, compare)."""

from __future__ import annotations

import argparse

from kbench.cli.app import add_stage
from kbench.stages import (
    agent_base, cell, compare, corpus, fit, index, inject, memory, memory_instances, memory_report, probes, replay, unlearn,
)

#: The title of these commands in `kbench --help`.
GROUP = "pipeline stages (`dvc repro` runs them in this order; each can also be run by hand)"
#: The DVC stages in pipeline order; each module has `COMMAND`, `HELP`, `Options` and `main`.
STAGE_MODULES = (corpus, index, agent_base, inject, fit, unlearn, probes, cell, replay, memory_instances, memory,
                 memory_report, compare)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    for stage in STAGE_MODULES:
        add_stage(sub, stage)
