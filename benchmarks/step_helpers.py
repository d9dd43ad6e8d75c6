"""What the LoRA step helpers' transport costs: the adapter's weights handed to a helper and
its micro-batches' gradients handed back, every step (`kbench.parametric.lora._StepHelpers`).

The agent base's adapter (`agent_base.lora` on `model.path`) is built once; each round pickles
its trainable weights, hands them to a one-worker process pool (spawn) whose task unpickles
them and returns a gradient-sized payload (one tensor per weight, as two micro-batches'
gradients would be), and unpickles that. The report gives the payload sizes and the median and
spread of a round's seconds over `--rounds`, beside a step's compute time when `--step-seconds`
is given (read from the agent-base stage's log), so the share of a step the transport takes.

    PYTHONPATH=src python benchmarks/step_helpers.py --rounds 20 --step-seconds 13 \\
        --json benchmarks/step_helpers.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from pathlib import Path

import torch

from kbench.backends.hf import load_weights
from kbench.design import load_design
from kbench.parametric.lora import _with_adapter
from kbench.workers import process_pool


def echo_gradients(message: bytes) -> bytes:
    """A helper's transport alone: unpickle the weights, return two micro-batches' worth of gradients."""
    weights, _, _ = pickle.loads(message)
    results = [(0.0, [torch.zeros_like(w) for w in weights]) for _ in range(2)]
    return pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=None,
                        help="a training step's seconds, for the share of a step the transport takes")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import peft

    params = load_design(args.params)
    settings = params.agent_base.lora
    model = load_weights(params.model)
    lora = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                           target_modules=settings.target_modules, task_type="CAUSAL_LM")
    _, trainable = _with_adapter(model, lora)
    weights = [p.detach() for p in trainable]
    sizes = {"tensors": len(weights), "weights_mb": sum(w.numel() * w.element_size() for w in weights) / 2**20}
    seconds = []
    with process_pool(1, threads=1) as pool:
        pool.submit(echo_gradients, pickle.dumps((weights[:1], [], 1))).result()  # start the worker
        for _ in range(args.rounds):
            started = time.perf_counter()
            message = pickle.dumps((weights, [], 1), protocol=pickle.HIGHEST_PROTOCOL)
            back = pickle.loads(pool.submit(echo_gradients, message).result())
            seconds.append(time.perf_counter() - started)
            assert len(back) == 2
    report = {
        **sizes,
        "gradients_mb": 2 * sizes["weights_mb"],
        "round_seconds_median": statistics.median(seconds),
        "round_seconds_min": min(seconds),
        "round_seconds_max": max(seconds),
        "rounds": args.rounds,
        "step_seconds": args.step_seconds,
        "share_of_step": statistics.median(seconds) / args.step_seconds if args.step_seconds else None,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
