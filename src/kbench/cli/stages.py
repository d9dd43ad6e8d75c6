"""Pipeline subcommands: `setup`, and the command of every DVC stage, which lives beside its
stage in `kbench.stages` (corpus, index, agent-base, inject, fit, unlearn, probes, cell, compare)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kbench.backends.packaged import DEFAULT_MODEL_DIR, ensure_default_model
from kbench.stages import agent_base, cell, compare, corpus, fit, index, inject, probes, unlearn

#: The DVC stages in pipeline order; each module has `COMMAND` and `add_subcommands(sub)`.
STAGE_MODULES = (corpus, index, agent_base, inject, fit, unlearn, probes, cell, compare)


def cmd_setup(args: argparse.Namespace) -> int:
    """Prepare inputs that are not pip packages: the default model folder and data/."""
    path = ensure_default_model(Path(args.model_dir))
    Path("data").mkdir(exist_ok=True)
    print(f"default model ready at {path}")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("setup", help="convert the packaged default model into models/ (once)")
    p.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    p.set_defaults(handler=cmd_setup)
    for stage in STAGE_MODULES:
        stage.add_subcommands(sub)
