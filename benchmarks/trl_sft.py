"""The project's LoRA trainer against TRL's `SFTTrainer`, side by side on the same examples, for
the decision of issue 43 item 5 (docs/parametric.md). Two trainings: the agent base
(`--training agent-base`, on the base model) and the LoRA-T+D injection adapter
(`--training injection`, on the trained agent base in `agent_base.out_dir`).

Both train the same LoRA (the training's `lora` section: rank, alpha, modules, learning rate,
schedule, steps or epochs, batch and micro-batch, seed) on the same tokenized examples with the
loss on the assistant turns only. TRL gets them pre-tokenized (`input_ids`, `labels`), padding-free, AdamW
with torch's default weight decay and the same constant or linear schedule, without gradient
checkpointing (TRL's default; the project's trainer does not checkpoint); it runs on this
process's threads, as the project's trainer does with `--helpers 0`. TRL's sampler orders the
examples its own way, so the two runs see other batches and their losses differ. Modes:

  kbench          `kbench.parametric.lora.train_lora`, one process (`--helpers 0`) or split
                  between this process and helpers as the stage runs (`--helpers 1`)
  trl             `trl.SFTTrainer`

The report gives, per mode, the wall seconds of the training and per step, the first and last
step losses and, with `--evaluate`, the gates the training feeds: for the agent base its
held-out format compliance and correctness (`evaluate_agent`), for the injection adapter the
direct and summary recall the inject stage records (`recall_metrics`). The P baseline's gates
(OR, dominant channel) follow from a `dvc repro` on the adopted trainer.

    PYTHONPATH=src python benchmarks/trl_sft.py --training agent-base --evaluate --json benchmarks/trl_sft.json
    PYTHONPATH=src python benchmarks/trl_sft.py --training injection --evaluate --json benchmarks/trl_sft_injection.json
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import torch

from kbench.backends.hf import load_model, load_weights
from kbench.corpus import load_corpus
from kbench.design import load_design
from kbench.parametric.agent_base import agent_base_data, evaluate_agent
from kbench.parametric.adapters import TARGET
from kbench.parametric.injection import training_entities, training_examples
from kbench.parametric.lora import IGNORE, tokenize_chat, total_steps, train_lora
from kbench.parametric.recall import probe_groups, recall_metrics


def train_kbench(params, settings, base_dir, examples, helpers: int):
    model, _ = load_model(params.model, base_dir)
    run = train_lora(model, examples, settings, helpers=helpers,
                     loader=functools.partial(load_weights, params.model) if helpers else None)
    return run.model.merge_and_unload(), run.step_losses


def train_trl(params, settings, base_dir, examples, scratch: Path):
    import datasets
    import peft
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load_model(params.model, base_dir)
    data = datasets.Dataset.from_dict({"input_ids": [e.input_ids for e in examples],
                                       "labels": [e.labels for e in examples]})
    config = SFTConfig(
        output_dir=str(scratch / "trl"), per_device_train_batch_size=settings.micro_batch_size,
        **({"max_steps": settings.steps} if settings.steps else {"num_train_epochs": settings.epochs}),
        gradient_accumulation_steps=settings.batch_size // settings.micro_batch_size,
        learning_rate=settings.learning_rate, lr_scheduler_type=settings.lr_schedule, warmup_steps=0,
        weight_decay=0.01, optim="adamw_torch", padding_free=True, max_length=None,  # tokenize_chat truncated them
        bf16=settings.mixed_precision == "bf16", use_cpu=True,
        gradient_checkpointing=False,  # the project's trainer does not checkpoint either
        seed=settings.seed, data_seed=settings.seed,
        logging_steps=1, save_strategy="no", report_to="none", dataloader_num_workers=0,
    )
    lora = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                           target_modules=settings.target_modules, task_type="CAUSAL_LM")
    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                         peft_config=lora, callbacks=[Losses()])
    trainer.train()
    return trainer.model.merge_and_unload(), losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--corpus", default="artifacts/corpus")
    parser.add_argument("--training", default="agent-base", choices=["agent-base", "injection"])
    parser.add_argument("--modes", nargs="+", default=["kbench", "trl"], choices=["kbench", "trl"])
    parser.add_argument("--helpers", type=int, default=0, help="the project's trainer's step helpers (the stage: 1)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the training's lora section)")
    parser.add_argument("--evaluate", action="store_true", help="score the agent-base gates of each trained model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    params = load_design(args.params)
    agent = args.training == "agent-base"
    settings = params.agent_base.lora if agent else params.injection.lora
    if args.steps is not None:
        settings = settings.model_copy(update={"steps": args.steps, "epochs": None})
    base_dir = None if agent else Path(params.agent_base.out_dir)
    corpus = load_corpus(args.corpus)
    report: dict[str, dict] = {"training": args.training, "threads": {"torch": torch.get_num_threads()}, "modes": {}}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        _, tokenizer = load_model(params.model, base_dir)
        if agent:
            data = agent_base_data(params, corpus, scratch / "stores")
            examples = [tokenize_chat(tokenizer, t, settings.max_length) for t in data.transcripts]
        else:
            entities = [corpus.entities[e] for e in training_entities(corpus, params)[TARGET]]
            examples = training_examples(tokenizer, entities, params.injection, params.agent.max_iters)
        steps = total_steps(len(examples), settings)
        learned = sum(sum(label != IGNORE for label in e.labels) for e in examples)
        report["examples"] = {"n": len(examples), "learned_tokens": learned, "steps": steps}
        for mode in args.modes:
            started = time.perf_counter()
            merged, losses = (train_kbench(params, settings, base_dir, examples, args.helpers) if mode == "kbench"
                              else train_trl(params, settings, base_dir, examples, scratch))
            seconds = time.perf_counter() - started
            entry = {"seconds": seconds, "seconds_per_step": seconds / steps,
                     "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
            if args.evaluate and agent:
                out = scratch / f"model-{mode}"
                merged.save_pretrained(out)
                tokenizer.save_pretrained(out)
                entry["gates"] = evaluate_agent(params.model.model_copy(update={"path": str(out)}), params,
                                                data.heldout_world, data.heldout_queries, data.heldout_index,
                                                params.agent_base.faker_seed)
            elif args.evaluate:
                merged.eval()
                entry["gates"] = recall_metrics(merged, tokenizer, probe_groups(corpus, params), params)
            report["modes"][mode] = entry
            print(json.dumps({mode: entry}, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
