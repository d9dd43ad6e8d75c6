"""Cells side by side: `execution.cell_workers` 1 (cells one after the other on every core) vs 2
(two cells at a time, each on half the cores), on the same cells, with the traces compared.

Run it in a repo whose pipeline has been built (a finished `dvc repro`, or at least `fit`):
each mode runs `kbench cell --all-methods` for one substrate into a scratch folder, untracked,
and the two modes must give byte-identical traces. Repeats alternate the order of the modes.

    PYTHONPATH=src python benchmarks/cell_workers.py --substrate R-struct --methods none eco repe star \\
        --repeats 2 --json benchmarks/cell_workers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def run_mode(workers: int, substrate: str, methods: list[str], out: Path, params: Path) -> float:
    data = yaml.safe_load(params.read_text())
    data["methods"] = methods
    data["execution"]["cell_workers"] = workers
    scratch_params = out.parent / f"params-{workers}.yaml"
    scratch_params.write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kbench.cli.main", "--params", str(scratch_params), "cell",
                    "--substrate", substrate, "--seed", "0", "--all-methods", "--no-track", "--no-progress",
                    "--out-root", str(out)], check=True)
    return time.perf_counter() - started


def traces(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("traces.jsonl"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--substrate", default="R-struct")
    parser.add_argument("--methods", nargs="+", default=["none", "eco", "repe", "star"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    identical = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            outs = {}
            for workers in ((1, 2) if repeat % 2 == 0 else (2, 1)):
                outs[workers] = Path(scratch) / f"r{repeat}-w{workers}"
                seconds[workers].append(run_mode(workers, args.substrate, args.methods, outs[workers], Path(args.params)))
                print(f"repeat {repeat}, cell_workers {workers}: {seconds[workers][-1]:.1f} s", flush=True)
            identical.append(traces(outs[1]) == traces(outs[2]) and bool(traces(outs[1])))
    speedups = [a / b for a, b in zip(seconds[1], seconds[2])]
    report = {
        "substrate": args.substrate, "methods": args.methods, "seconds": seconds,
        "speedup_median": statistics.median(speedups), "speedup_spread": [min(speedups), max(speedups)],
        "traces_identical": all(identical),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
