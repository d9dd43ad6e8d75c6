"""What the two recipe levers on issue 13's fixed costs would cost in what the stages measure.

  agent_base  the agent base trained for each of `--steps` optimizer steps (`agent_base.lora.steps`)
              at each of `--learning-rates` (`agent_base.lora.learning_rate`; default: the
              params'), then scored on its held-out people (format compliance, correctness)
              as the stage scores it
  inject      LoRA-T+D (`injection.lora`) on the agent base of a finished `dvc repro inject`,
              with the recall probes of the inject stage after each epoch from `--from-epoch`
              (read on the adapter, not merged: the same function up to float rounding)

Run in a checkout that has run the corpus, agent_base and inject stages:

    PYTHONPATH=src python benchmarks/recipe_levers.py --steps 24 40 --from-epoch 4 \\
        --json benchmarks/recipe_levers.json

`--from-epoch 0` skips the inject part (the agent base alone needs only the corpus stage);
`--extra-heldout N` scores each agent base on N more held-out people (another Faker seed), where
the stage's 10 give its gates in steps of 0.1.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kbench.config import load_params
from kbench.backends.hf import load_tokenizer
from kbench.corpus import FORGET_EVAL, load_corpus
from kbench.parametric.adapters import TARGET
from kbench.parametric.agent_base import (
    agent_base_data, agent_model_config, evaluate_agent, out_of_corpus_people, train_agent_base,
)
from kbench.parametric.injection import train_injection, training_entities
from kbench.parametric.recall import probe_groups, recall_metrics

EXTRA_SEED = 104729  # the Faker seed of `--extra-heldout`'s people (the stage's is agent_base.faker_seed)


def agent_base_at(params: Any, corpus: Any, steps: int, learning_rate: float, extra: int) -> dict[str, float]:
    """The agent-base stage at `steps` optimizer steps and `learning_rate`, into a scratch folder: its
    metrics, and with `extra` its format compliance and correctness on that many more held-out people."""
    lora = params.agent_base.lora.model_copy(update={"steps": steps, "learning_rate": learning_rate})
    changed = params.model_copy(update={"agent_base": params.agent_base.model_copy(update={"lora": lora})})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        metrics = train_agent_base(changed, corpus, Path(scratch) / "agent_base")
        seconds = time.perf_counter() - started
        if extra:
            scores = extra_heldout(changed, corpus, Path(scratch) / "agent_base", extra, Path(scratch) / "extra")
            metrics.update({f"extra_{key}": value for key, value in scores.items()})
    return {**metrics, "seconds": seconds}


def extra_heldout(params: Any, corpus: Any, agent_base: Path, n: int, scratch: Path) -> dict[str, float]:
    """The stage's held-out evaluation on `n` people of another Faker seed (EXTRA_SEED), none
    sharing a name with the training people: the same gates with more power."""
    config = params.agent_base
    trained = {p.name for p in out_of_corpus_people(corpus, config, params.corpus.reference_date)[: config.n_train_people]}
    other = config.model_copy(update={"faker_seed": EXTRA_SEED, "n_train_people": 0, "n_heldout_people": n})
    data = agent_base_data(params.model_copy(update={"agent_base": other}), corpus, scratch)
    if trained & set(data.heldout_world.entities[i].name for i in data.heldout_world.pools[FORGET_EVAL]):
        raise SystemExit("an extra held-out person shares a name with a training person")
    model = params.model.model_copy(update={"path": str(agent_base)})
    return evaluate_agent(model, params, data.heldout_world, data.heldout_queries, data.heldout_index, EXTRA_SEED)


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
    parser.add_argument("--learning-rates", type=float, nargs="*", default=None)
    parser.add_argument("--from-epoch", type=int, default=4, help="0: no inject part")
    parser.add_argument("--extra-heldout", type=int, default=0, help="also score each agent base on this many other people")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    params, corpus = load_params(args.params), load_corpus(args.corpus)
    inject = inject_by_epoch(params, corpus, args.from_epoch) if args.from_epoch > 0 else []
    report: dict[str, Any] = {"inject": inject, "agent_base": {}}
    for learning_rate in args.learning_rates or [params.agent_base.lora.learning_rate]:
        for steps in args.steps:
            key = f"{steps}@{learning_rate:g}"
            report["agent_base"][key] = agent_base_at(params, corpus, steps, learning_rate, args.extra_heldout)
            print(f"agent base, {key}: {json.dumps(report['agent_base'][key])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
