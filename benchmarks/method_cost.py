"""Method cost: the time each method adds per trajectory relative to `none`, and the fit stage.

Run it in a repo whose pipeline has been built up to the cells (`dvc repro fit inject`, or a
finished `dvc repro`): it reads `params.yaml`, the corpus, the index, the agent base, the
adapters and the fitted artifacts. Each (substrate, method) runs in its own process on the
same queries, timing `agent.run` only (no start-up, scoring or tracking), and every repeat
runs the methods in a rotated order so drift on a noisy machine falls on each alike. The
report gives seconds per trajectory, the ratio to `none` within each repeat, and its spread
over repeats; the fit stage is timed the same way (`--fit`).

    PYTHONPATH=src python benchmarks/method_cost.py --substrates C R-struct P --n 6 --repeats 2 \\
        --fit --json benchmarks/method_cost.json
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

from kbench.config import load_params
from kbench.names import BASELINE_METHOD, LORA, PARAMETRIC


def run_one(substrate: str, method: str, n: int, out: Path) -> None:
    """One cell's trajectories, timed, in this process."""
    from kbench.agent import setup_cell
    from kbench.corpus import load_corpus
    from kbench.methods import method_class
    from kbench.methods.fitting import load_fitted
    from kbench.parametric import agent_model_config, base_fingerprint, cell_adapter
    from kbench.records import SPLITS
    from kbench.stages.corpus import CORPUS_DIR
    from kbench.stages.index import INDEX_DIR

    params = load_params()
    corpus = load_corpus(CORPUS_DIR)
    model = agent_model_config(params)
    adapter = str(cell_adapter(params, substrate, LORA, method)) if substrate == PARAMETRIC else None
    fitted = load_fitted(params, method, base_fingerprint(model.path)) if method_class(method).fits else None
    agent = setup_cell(params, corpus, model, substrate=substrate, method=method, seed=0, index_dir=INDEX_DIR,
                       adapter_path=adapter, fitted=fitted)
    items = [(q, split) for split in SPLITS for q in corpus.sample_queries(split, n, 0, tuple(params.queries.fields))]
    records = []
    started = time.perf_counter()
    agent.run(items, records.append)
    seconds = time.perf_counter() - started
    out.write_text(json.dumps({"substrate": substrate, "method": method, "trajectories": len(records),
                               "seconds": seconds, "steps": sum(len(r.steps) for r in records)}))


def time_fit(out: Path) -> None:
    from kbench.corpus import load_corpus
    from kbench.stages.corpus import CORPUS_DIR
    from kbench.stages.fit import run_fit_stage

    params = load_params()
    params = params.model_copy(update={"fit": params.fit.model_copy(update={"out_dir": str(out.parent / "fitted")})})
    started = time.perf_counter()
    results = run_fit_stage(params, load_corpus(CORPUS_DIR), track=False)
    out.write_text(json.dumps({"seconds": time.perf_counter() - started, "methods": sorted(results)}))


def _subprocess(args: list[str], out: Path) -> dict:
    subprocess.run([sys.executable, __file__, *args, "--out", str(out)], check=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--substrates", nargs="+", default=["C", "R-text", "R-struct", PARAMETRIC])
    parser.add_argument("--methods", nargs="+", default=None, help="default: params.yaml's methods but gold")
    parser.add_argument("--n", type=int, default=6, help="queries per split")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--fit", action="store_true", help="also time the fit stage")
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", nargs=2, metavar=("SUBSTRATE", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--time-fit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return run_one(*args.one, args.n, Path(args.out))
    if args.time_fit:
        return time_fit(Path(args.out))

    methods = args.methods or [m for m in load_params().methods if m != "gold"]
    if BASELINE_METHOD not in methods:
        methods = [BASELINE_METHOD, *methods]
    report: dict = {"n_per_split": args.n, "repeats": args.repeats, "substrates": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for substrate in args.substrates:
            runs: dict[str, list[dict]] = {m: [] for m in methods}
            for repeat in range(args.repeats):
                order = methods[repeat % len(methods):] + methods[: repeat % len(methods)]
                for method in order:
                    result = _subprocess(["--one", substrate, method, "--n", str(args.n)],
                                         Path(scratch) / f"{substrate}-{method}-{repeat}.json")
                    runs[method].append(result)
                    print(f"{substrate} {method} repeat {repeat}: {result['seconds']:.1f} s", flush=True)
            rows = {}
            for method in methods:
                per_trajectory = [r["seconds"] / r["trajectories"] for r in runs[method]]
                ratios = [r["seconds"] / b["seconds"] for r, b in zip(runs[method], runs[BASELINE_METHOD])]
                rows[method] = {
                    "seconds_per_trajectory": statistics.median(per_trajectory),
                    "ratio_to_none": statistics.median(ratios),
                    "ratio_spread": [min(ratios), max(ratios)],
                    "added_seconds_per_trajectory": statistics.median(per_trajectory)
                    - statistics.median(r["seconds"] / r["trajectories"] for r in runs[BASELINE_METHOD]),
                    "steps": runs[method][0]["steps"],
                }
            report["substrates"][substrate] = rows
        if args.fit:
            fits = [_subprocess(["--time-fit"], Path(scratch) / f"fit-{i}.json")["seconds"] for i in range(args.repeats)]
            report["fit_seconds"] = {"median": statistics.median(fits), "spread": [min(fits), max(fits)]}

    print(f"\nmethod cost, n = {args.n} per split, {args.repeats} repeats (median; ratio spread min-max)")
    for substrate, rows in report["substrates"].items():
        for method, row in rows.items():
            print(f"  {substrate:9} {method:10} {row['seconds_per_trajectory']:6.2f} s/trajectory  "
                  f"x{row['ratio_to_none']:.2f} [{row['ratio_spread'][0]:.2f}, {row['ratio_spread'][1]:.2f}]  "
                  f"steps {row['steps']}")
    if "fit_seconds" in report:
        print(f"  fit stage: {report['fit_seconds']['median']:.1f} s {report['fit_seconds']['spread']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
