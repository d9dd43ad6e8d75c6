"""The `agent_base` stage (`kbench agent-base`): LoRA-tune the base model into a ReAct agent (`kbench.parametric.agent_base`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.config import Params
from kbench.corpus import load_corpus
from kbench.parametric.agent_base import train_agent_base
from kbench.stages import track_option
from kbench.stages.corpus import corpus_option

COMMAND = "agent-base"
HELP = "LoRA-tune the base model into a ReAct agent (agent_base.*)"
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


@dataclass(frozen=True)
class Options:
    """`kbench agent-base`'s options."""

    #: The corpus the training transcripts are made from.
    corpus: Path = corpus_option()
    #: Record the agent base as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    run_agent_base_stage(params, options.corpus, track=options.track)
    return 0
