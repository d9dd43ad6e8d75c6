"""Leak@k's sampled probe replies: every branch's k rows in one engine batch, or one branch's k
rows per batch (what `kbench.replay.run.sampled_probes` does).

The engine pads every row of a batch to the longest cache and copies each row's cache out when
it ends, so one batch of operators x k rows over a session of L tokens holds about
2 x operators x k x L tokens of keys and values. Each mode runs in its own process over the
same session-sized prompt (the corpus's biographies up to `--tokens`), `--branches` branches
of `--k` rows each, seeded sampling at temperature 0.7, so its peak RSS is its own.

    PYTHONPATH=src python benchmarks/leak_at_k_batching.py --model artifacts/agent_base \\
        --tokens 2000 --branches 11 --k 5 --repeats 2 --json benchmarks/leak_at_k_batching.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

MODES = ("all", "branch")


def run_mode(mode: str, model_path: str, tokens: int, branches: int, k: int) -> dict:
    from kbench.backends.engine import KVState
    from kbench.backends.hf import HFBackend
    from kbench.config import CorpusConfig, ModelConfig
    from kbench.corpus import generate_corpus

    torch.set_num_threads(1)
    backend = HFBackend(ModelConfig(path=model_path, device="cpu", dtype="float32"))
    engine, tokenizer = backend.engine, backend.tokenizer
    corpus = generate_corpus(CorpusConfig())
    text = " ".join(e.bio for e in corpus.entities.values())
    prompt = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    base = backend.session()
    engine.prefill([base], [prompt])
    started = time.perf_counter()
    rows = [(b, j) for b in range(branches) for j in range(k)]
    groups = [rows] if mode == "all" else [rows[b * k:(b + 1) * k] for b in range(branches)]
    replies = []
    for group in groups:
        generators = [torch.Generator().manual_seed(1000 * b + j) for b, j in group]

        def choose(row: int, logits: torch.Tensor, generators=generators) -> int:
            weights = torch.softmax(logits.float() / 0.7, dim=-1)
            return int(torch.multinomial(weights, 1, generator=generators[row]))

        states = [KVState(list(base.tokens), base.layers) for _ in group]  # as a branch's fork shares them
        replies += engine.generate(states, [prompt + tokenizer.encode(" Who?", add_special_tokens=False)] * len(group),
                                   max_new_tokens=32, share_prefixes=False, choose=choose)
    seconds = time.perf_counter() - started
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"mode": mode, "seconds": seconds, "peak_rss_gb": peak_gb, "rows": len(rows),
            "replies": [tokenizer.decode(r) for r in replies]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--branches", type=int, default=11)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in its own process
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.model, args.tokens, args.branches, args.k)))
        return
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode in MODES:  # side by side, alternating
            out = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", args.model, "--tokens",
                                  str(args.tokens), "--branches", str(args.branches), "--k", str(args.k)],
                                 check=True, capture_output=True, text=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    report = {"args": {k: v for k, v in vars(args).items() if k not in ("json", "mode")}, "modes": {}}
    for mode, done in runs.items():
        report["modes"][mode] = {
            "seconds": [round(r["seconds"], 2) for r in done],
            "peak_rss_gb": [round(r["peak_rss_gb"], 2) for r in done],
            "median_seconds": round(statistics.median(r["seconds"] for r in done), 2),
        }
    same = [a["replies"] == b["replies"] for a, b in zip(runs["all"], runs["branch"])]
    report["same_replies"] = sum(x == y for a, b in zip(runs["all"], runs["branch"])
                                 for x, y in zip(a["replies"], b["replies"])) / max(1, sum(len(a["replies"]) for a in runs["all"]))
    report["identical_runs"] = same
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
