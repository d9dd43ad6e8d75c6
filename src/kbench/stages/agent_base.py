"""The `agent_base` stage (`kbench agent-base`): LoRA-tune the base model into a ReAct agent (`kbench.parametric.agent_base`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kbench import io, tracking
from kbench.cli.app import add_command
from kbench.config import Params
from kbench.corpus import load_corpus
from kbench.design import load_design
from kbench.parametric.agent_base import train_agent_base
from kbench.stages.corpus import CORPUS_DIR

COMMAND = "agent-base"
METRICS_FILE = "agent_base_metrics.json"


def run_agent_base_stage(params: Params, corpus_dir: Path, *, track: bool = True) -> dict[str, float]:
    """Train and save the agent base under `agent_base.out_dir` and record it; return its metrics."""
    out = Path(params.agent_base.out_dir)
    metrics = train_agent_base(params, load_corpus(corpus_dir), out)
    io.write_json(out / METRICS_FILE, metrics)
    tracking.record_output(
        params, out, tracking.KIND_AGENT_BASE, params.base_model,
        tags={tracking.TAG_BASE_MODEL: params.base_model}, metrics=metrics, artifacts=[METRICS_FILE], track=track,
    )
    return metrics


def cmd_agent_base(args: argparse.Namespace) -> int:
    run_agent_base_stage(load_design(args.params), Path(args.corpus), track=not args.no_track)
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    add_command(sub, COMMAND, cmd_agent_base, "LoRA-tune the base model into a ReAct agent (agent_base.*)",
                corpus=CORPUS_DIR)
