"""float32 against bfloat16 on this CPU: a training-shaped matrix product and a decode pass.

Why the LoRA trainings run under bfloat16 autocast (`mixed_precision: bf16`) while inference
stays float32 (docs/parametric.md, "Mixed precision"):

  matmul   GFLOPS of (2048 x 576) @ (576 x 1536), the shape of a training pass of
           SmolLM2-135M, after 3 warm-ups, over `--repeats` products, on 1 and 2 threads
  decode   milliseconds of one decode pass of the model (`model.path`) over a random cache,
           per (rows, cache length), median of 6, on one thread (a cell worker's share)

    PYTHONPATH=src python benchmarks/precision_kernels.py --json benchmarks/precision_kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from kbench.config import load_params

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SHAPE = (2048, 576, 1536)
DECODE_SHAPES = ((1, 200), (12, 200), (12, 600), (24, 600))


def matmul_gflops(dtype: torch.dtype, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    m, k, n = SHAPE
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * m * k * n * repeats / (time.perf_counter() - started) / 1e9


def decode_ms(model_path: str, dtype: torch.dtype) -> dict[str, float]:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
    config = model.config
    heads, width = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    result = {}
    with torch.inference_mode():
        for rows, length in DECODE_SHAPES:
            cache = DynamicCache()
            for layer in range(config.num_hidden_layers):
                cache.update(torch.randn(rows, heads, length, width, dtype=dtype),
                             torch.randn(rows, heads, length, width, dtype=dtype), layer)
            mask = torch.ones(rows, length + 1, dtype=torch.long)
            token = torch.randint(100, 10_000, (rows, 1))
            times = []
            for _ in range(6):
                started = time.perf_counter()
                model(input_ids=token, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
                times.append(time.perf_counter() - started)
                mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=-1)
            result[f"{rows}x{length}"] = 1000 * statistics.median(times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report = {"avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()), "matmul_gflops": {}, "decode_ms": {}}
    for name, dtype in DTYPES.items():
        for threads in (1, 2):
            gflops = matmul_gflops(dtype, threads, args.repeats)
            report["matmul_gflops"][f"{name}/{threads}"] = gflops
            print(f"matmul {name}, {threads} thread(s): {gflops:.0f} GFLOPS", flush=True)
    model_path = load_params(args.params).model.path
    for name, dtype in DTYPES.items():
        report["decode_ms"][name] = decode_ms(model_path, dtype)
        print(f"decode pass {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in report["decode_ms"][name].items()),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
