"""What the two recipe levers on issue 13's fixed costs would cost in what the stages measure.

  agent_base  the agent base trained for each of `--steps` optimizer steps (`agent_base.lora.steps`),
              then scored on its held-out people (format compliance, correctness) as the
              stage scores it
  inject      LoRA-T+D (`injection.lora`) on the agent base of a finished `dvc repro inject`,
              with the recall probes of the inject stage after each epoch from `--from-epoch`
              (read on the adapter, not merged: the same function up to float rounding)

Run in a checkout that has run the corpus, agent_base and inject stages:

    PYTHONPATH=src python benchmarks/recipe_levers.py --steps 24 40 --from-epoch 4 \\
        --json benchmarks/recipe_levers.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kbench.config import load_params
from kbench.corpus import load_corpus
from kbench.backends.hf import load_tokenizer
from kbench.parametric.adapters import TARGET
from kbench.parametric.agent_base import agent_model_config, train_agent_base
from kbench.parametric.injection import train_injection, training_entities
from kbench.parametric.recall import probe_groups, recall_metrics


def agent_base_at(params: Any, corpus: Any, steps: int) -> dict[str, float]:
    """The agent-base stage at `steps` optimizer steps, into a scratch folder: its metrics."""
    lora = params.agent_base.lora.model_copy(update={"steps": steps})
    changed = params.model_copy(update={"agent_base": params.agent_base.model_copy(update={"lora": lora})})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        metrics = train_agent_base(changed, corpus, Path(scratch) / "agent_base")
    return {**metrics, "seconds": time.perf_counter() - started}


def inject_by_epoch(params: Any, corpus: Any, from_epoch: int) -> list[dict[str, float]]:
    """LoRA-T+D's loss and recall probes after each epoch from `from_epoch`."""
    base = Path(agent_model_config(params).path)
    tokenizer = load_tokenizer(base)
    groups = probe_groups(corpus, params)
    rows: list[dict[str, float]] = []

    def on_epoch(epoch: int, model: Any, loss: float) -> None:
        if epoch >= from_epoch:
            rows.append({"epoch": epoch, "loss": loss, **recall_metrics(model, tokenizer, groups, params)})
            print(json.dumps(rows[-1]), flush=True)

    train_injection(params, corpus, base, training_entities(corpus, params)[TARGET], on_epoch=on_epoch)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--corpus", default="artifacts/corpus")
    parser.add_argument("--steps", type=int, nargs="*", default=[24, 40])
    parser.add_argument("--from-epoch", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    params, corpus = load_params(args.params), load_corpus(args.corpus)
    report: dict[str, Any] = {"inject": inject_by_epoch(params, corpus, args.from_epoch), "agent_base": {}}
    for steps in args.steps:
        report["agent_base"][steps] = agent_base_at(params, corpus, steps)
        print(f"agent base, {steps} steps: {json.dumps(report['agent_base'][steps])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
