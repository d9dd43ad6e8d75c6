"""LoRA training throughput: one padded row per example against the packed prefix trie.

Workloads, the real examples of the default params:

  inject      LoRA-T+D's records (`injection.lora` on the agent base; needs the corpus and
              agent-base stages' outputs)
  agent_base  the agent base's scripted transcripts (`agent_base.lora` on `model.path`)

Modes, each run in its own process for `--steps` optimizer steps of the recipe:

  padded      the loss before packing (up to 0ee8764) at that day's micro-batch size
              (injection 4, agent base 1): a batch sorted longest first, each micro-batch one
              right-padded row per example
  packed      `kbench.parametric.lora`: a micro-batch of examples sorted by token ids runs as
              one sequence holding each shared prefix once (`pack`), in float32
              (`mixed_precision: no`)
  bf16        packed, with the forward passes under bfloat16 autocast (`mixed_precision: bf16`,
              the recipe since 6f5c499)
  bf16-eager  bf16 with `attention: eager`: transformers' attention (matrix products and a
              float32 softmax) instead of torch's scaled-dot-product kernel, so other weights
  bf16-cast   bf16 with the frozen base linear weights cast to bfloat16 once, before the
              adapter is added, not by autocast at every forward pass
  bf16-stem   bf16 with `packing: stem` and a whole batch a micro-batch: the prefix a batch's
              examples share runs once, each example's rest in its own causal pass over it

The report gives seconds per step (median and spread over `--repeats`), the tokens a step
feeds the model, the peak RSS and the first step losses (the same in both modes up to float
rounding: the loss is the same sum over the same learned tokens).

    PYTHONPATH=src python benchmarks/lora_throughput.py --workload inject --steps 15 --repeats 2 \\
        --json benchmarks/lora_throughput.json
    PYTHONPATH=src python benchmarks/lora_throughput.py --workload agent_base --modes packed bf16 \\
        --steps 6 --repeats 3 --json benchmarks/mixed_precision_agent_base.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import kbench.parametric.lora as lora
from kbench.backends.hf import load_model
from kbench.config import LoraConfig, Params, load_params
from kbench.corpus import load_corpus
from kbench.parametric.agent_base import agent_base_data, agent_model_config
from kbench.parametric.injection import training_entities, training_examples
from kbench.parametric.lora import IGNORE, Example, micro_batches, pack, tokenize_chat

MODES = ("padded", "packed", "bf16", "bf16-eager", "bf16-cast", "bf16-stem")
WORKLOADS = ("inject", "agent_base")
#: The micro-batch size of each workload's recipe before packing (params.yaml at 0ee8764).
PADDED_MICRO_BATCH = {"inject": 4, "agent_base": 1}


def padded_micro_batches(rows: Sequence[Example], size: int) -> list[list[Example]]:
    ordered = sorted(rows, key=lambda row: len(row.input_ids), reverse=True)
    return [ordered[start : start + size] for start in range(0, len(ordered), size)]


def padded_loss(model: Any, rows: Sequence[Example]) -> tuple[torch.Tensor, int]:
    """One right-padded row per example; logits at the union of the rows' predicting positions."""
    device = next(model.parameters()).device
    width = max(len(r.input_ids) for r in rows)
    ids = torch.tensor([r.input_ids + [0] * (width - len(r.input_ids)) for r in rows], device=device)
    labels = torch.tensor([r.labels + [IGNORE] * (width - len(r.labels)) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r.input_ids) + [0] * (width - len(r.input_ids)) for r in rows], device=device)
    targets = labels[:, 1:]
    predicting = (targets != IGNORE).any(dim=0).nonzero().squeeze(1)
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=predicting).logits
    kept = targets[:, predicting]
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), kept.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return loss, int((kept != IGNORE).sum())


def workload(params: Params, name: str, corpus_dir: str) -> tuple[Any, list[Example], LoraConfig]:
    """(model, examples, LoRA settings) of a workload, as its stage builds them."""
    if name == "inject":
        corpus = load_corpus(corpus_dir)
        model, tokenizer = load_model(params.model, agent_model_config(params).path)
        entities = [corpus.entities[e] for e in training_entities(corpus, params)["target"]]
        return model, training_examples(tokenizer, entities, params.injection, params.agent.max_iters), \
            params.injection.lora
    model, tokenizer = load_model(params.model)
    with tempfile.TemporaryDirectory() as scratch:
        transcripts = agent_base_data(params, load_corpus(corpus_dir), scratch).transcripts
    settings = params.agent_base.lora
    return model, [tokenize_chat(tokenizer, t, settings.max_length) for t in transcripts], settings


def fed_tokens(examples: Sequence[Example], settings: LoraConfig, steps: int, mode: str) -> int:
    """Tokens the first `steps` steps feed the model in `mode`."""
    split = padded_micro_batches if mode == "padded" else micro_batches
    fed = 0
    for step, (_, indices) in enumerate(lora._batches(len(examples), settings, random.Random(settings.seed))):
        if step == steps:
            break
        for rows in split([examples[i] for i in indices], settings.micro_batch_size):
            if mode == "padded":
                fed += max(len(r.input_ids) for r in rows) * len(rows)
            elif settings.packing == "stem":
                stem = lora.stem_length(rows)
                fed += stem + sum(learned[-1] - stem for learned in map(lora.learned_positions, rows) if learned)
            else:
                fed += len(pack(rows).input_ids)
    return fed


def child(args: argparse.Namespace) -> None:
    params = load_params(args.params)
    model, examples, settings = workload(params, args.workload, args.corpus)
    update = {"steps": args.steps, "epochs": None, "mixed_precision": "bf16" if args.mode.startswith("bf16") else "no"}
    if args.mode == "bf16-eager":
        update["attention"] = "eager"
    if args.mode == "padded":
        update["micro_batch_size"] = PADDED_MICRO_BATCH[args.workload]
    if args.mode == "bf16-stem":
        update.update(packing="stem", micro_batch_size=settings.batch_size)
    if args.micro_batch_size:
        update["micro_batch_size"] = args.micro_batch_size
    settings = settings.model_copy(update=update)
    if args.mode == "padded":
        lora.micro_batches, lora.label_position_loss = padded_micro_batches, padded_loss
    if args.mode == "bf16-cast":
        # Autocast casts a float32 weight at every forward pass; a frozen one can be cast once.
        # peft wraps each linear in place, so the plain linears of the model are the frozen bases.
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.get_output_embeddings():
                module.weight.data = module.weight.data.to(torch.bfloat16)
    started = time.perf_counter()
    run = lora.train_lora(model, examples, settings)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "mode": args.mode, "steps": args.steps, "seconds": seconds, "seconds_per_step": seconds / args.steps,
        "micro_batch_size": settings.micro_batch_size, "n_examples": len(examples),
        "fed_tokens": fed_tokens(examples, settings, args.steps, args.mode),
        "real_tokens_per_epoch": sum(len(e.input_ids) for e in examples),
        "first_losses": run.step_losses[:3],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--corpus", default="artifacts/corpus")
    parser.add_argument("--workload", choices=WORKLOADS, default="inject")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--micro-batch-size", type=int, default=0,
                        help="override every mode's micro-batch size (0: the recipe's, padded: PADDED_MICRO_BATCH)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return child(args)
    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    for repeat in range(args.repeats):
        for mode in args.modes:
            command = [sys.executable, __file__, "--mode", mode, "--params", args.params, "--corpus", args.corpus,
                       "--workload", args.workload, "--steps", str(args.steps),
                       "--micro-batch-size", str(args.micro_batch_size)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            runs[mode].append(result)
            print(f"{args.workload} {mode} (repeat {repeat + 1}): {result['seconds_per_step']:.2f} s/step, "
                  f"{result['fed_tokens'] / args.steps:.0f} tokens/step, peak {result['peak_rss_gib']:.2f} GiB, "
                  f"first losses {[round(x, 5) for x in result['first_losses']]}", flush=True)
    summary = {
        mode: {
            "seconds_per_step_median": statistics.median(r["seconds_per_step"] for r in rs),
            "seconds_per_step_all": [r["seconds_per_step"] for r in rs],
            "fed_tokens_per_step": rs[0]["fed_tokens"] / args.steps,
            "peak_rss_gib_max": max(r["peak_rss_gib"] for r in rs),
            "first_losses": rs[0]["first_losses"],
        }
        for mode, rs in runs.items()
    }
    if {"padded", "packed"} <= set(summary):
        summary["speed_up"] = summary["padded"]["seconds_per_step_median"] / summary["packed"]["seconds_per_step_median"]
        print(f"packed is {summary['speed_up']:.2f}x padded")
    # Per-repeat ratios of modes run side by side: (slower reference, mode, summary key).
    for reference, mode, key in (("packed", "bf16", "bf16_speed_up"), ("bf16", "bf16-eager", "bf16-eager_speed_up"),
                                 ("bf16", "bf16-cast", "bf16-cast_speed_up"), ("bf16", "bf16-stem", "bf16-stem_speed_up")):
        if {reference, mode} <= set(summary):
            ratios = [r["seconds_per_step"] / m["seconds_per_step"] for r, m in zip(runs[reference], runs[mode])]
            summary[key] = {"median": statistics.median(ratios), "per_repeat": ratios}
            print(f"{mode} is {statistics.median(ratios):.2f}x {reference} (per repeat {[round(x, 2) for x in ratios]})")
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": args.workload, "runs": runs, "summary": summary},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
