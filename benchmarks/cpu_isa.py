"""What holding PyTorch's kernels to AVX2 costs (`kbench.PINNED_CPU_ISA`, docs/tracking.md, "The
same bytes on every machine"), against the CPU's own widest kernels (`KBENCH_CPU_ISA=native`).

Each repeat runs both settings, in alternating order, each in its own process on 2 threads:

  train    seconds of 3 forward and backward passes of the model over 8 rows of 256 tokens
           (after one warm-up pass), the shape of a training step
  decode   seconds of greedy `generate` of 32 tokens for 8 rows of 200-token prompts

and prints the medians, the min-max spread and native / pinned ratios.

    PYTHONPATH=src python benchmarks/cpu_isa.py --model models/smollm2-135m-instruct --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOAD = r"""
import json, sys, time
import kbench, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(2)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = torch.randint(10, 20000, (8, 256))
model.train()
model(input_ids=ids, labels=ids).loss.backward()
started = time.perf_counter()
for _ in range(3):
    model(input_ids=ids, labels=ids).loss.backward()
train = time.perf_counter() - started
model.eval()
prompt = torch.randint(10, 20000, (8, 200))
with torch.no_grad():
    started = time.perf_counter()
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, min_new_tokens=32,
                         do_sample=False, pad_token_id=0)
    decode = time.perf_counter() - started
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "train": train, "decode": decode,
                  "tokens": out[:, 200:].tolist()}))
"""

SETTINGS = {"pinned": {}, "native": {"KBENCH_CPU_ISA": "native"}}


def run(model: str, setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE",
                                                         "KBENCH_CPU_ISA")}
    env |= {"OMP_NUM_THREADS": "2", **SETTINGS[setting]}
    out = subprocess.run([sys.executable, "-c", WORKLOAD, model], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for repeat in range(args.repeats):
        order = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            found[name].append(run(args.model, name))
            print(f"repeat {repeat} {name}: {found[name][-1]['capability']} train {found[name][-1]['train']:.2f} s, "
                  f"decode {found[name][-1]['decode']:.2f} s", flush=True)
    summary: dict = {"repeats": args.repeats, "model": args.model}
    for name, rows in found.items():
        summary[name] = {"capability": rows[0]["capability"]}
        for part in ("train", "decode"):
            values = [r[part] for r in rows]
            summary[name][part] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for part in ("train", "decode"):
        summary[f"{part}_native_over_pinned"] = summary["native"][part]["median"] / summary["pinned"][part]["median"]
    summary["same_tokens"] = found["native"][0]["tokens"] == found["pinned"][0]["tokens"]
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
