"""A decode pass on transformers' concatenating cache against the engine's `GrowingLayer`.

`DynamicLayer` copies the whole cache at every forward pass (`torch.cat`); the engine's
batch caches write each new column into spare ones (docs/agent.md). For each (rows, prompt
length): prefill a random prompt into each cache kind, decode `--steps` tokens greedily,
report the median pass in milliseconds, and check that both kinds give the same logits bit
for bit. The kinds alternate over `--repeats` rounds in one process, so a ratio is measured
side by side.

    PYTHONPATH=src python benchmarks/decode_cache.py --model artifacts/agent_base \
        --json benchmarks/decode_cache.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from kbench.backends.engine import growing_cache
from kbench.config import load_params

SHAPES = ((16, 300), (16, 700))
CACHES = {"concatenating": DynamicCache, "growing": growing_cache}
KINDS = tuple(CACHES)


def decode(model, kind: str, prompt: torch.Tensor, steps: int) -> tuple[list[float], torch.Tensor]:
    """Seconds of each decode pass after a prefill of `prompt`, and every step's logits."""
    cache = CACHES[kind]()
    rows, length = prompt.shape
    seconds, logits = [], []
    with torch.inference_mode():
        output = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        mask = torch.ones(rows, length, dtype=torch.long)
        for _ in range(steps):
            token = output.logits[:, -1:].argmax(-1)
            logits.append(output.logits[:, -1])
            mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=-1)
            started = time.perf_counter()
            output = model(input_ids=token, attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                           cache=cache, use_cache=True, logits_to_keep=1)
            seconds.append(time.perf_counter() - started)
    return seconds, torch.stack(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: params.yaml's model.path)")
    parser.add_argument("--steps", type=int, default=24, help="decode passes per measurement")
    parser.add_argument("--repeats", type=int, default=4, help="alternating rounds of both kinds")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    path = args.model or load_params().model.path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    report = {"model": str(path), "torch_threads": torch.get_num_threads(), "steps": args.steps, "shapes": []}
    for rows, length in SHAPES:
        prompt = torch.randint(100, 10_000, (rows, length), generator=generator)
        medians: dict[str, list[float]] = {kind: [] for kind in KINDS}
        identical = True
        for _ in range(args.repeats):
            reference = None
            for kind in KINDS:
                seconds, logits = decode(model, kind, prompt, args.steps)
                medians[kind].append(1000 * statistics.median(seconds[2:]))
                identical &= reference is None or torch.equal(logits, reference)
                reference = logits if reference is None else reference
        ratios = [g / c for c, g in zip(medians["concatenating"], medians["growing"])]
        report["shapes"].append({"rows": rows, "prompt": length, "pass_ms": medians, "ratios": ratios,
                                 "identical_logits": identical})
        print(f"rows {rows}, prompt {length}: pass ms concatenating {[round(m, 1) for m in medians['concatenating']]}, "
              f"growing {[round(m, 1) for m in medians['growing']]}; growing / concatenating "
              f"{[round(r, 2) for r in ratios]}; identical logits: {identical}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
