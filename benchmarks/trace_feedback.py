"""What the observer's feedback on every trace costs: a cell's traces logged to a fresh SQLite
MLflow store with and without `judge_trace` (the assessments), side by side, alternating.

    PYTHONPATH=src python benchmarks/trace_feedback.py artifacts/cells/C__s0 --repeats 3 \\
        --json benchmarks/trace_feedback.json

The records are every traces.jsonl under the folder given (one cell stage's output: all its
method cells). The cell stage's own wall time for the same folder (BENCHMARKS.md) is the
denominator of the overhead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def timed_logging(records, judge: bool) -> float:
    """Seconds to log `records` as traces of one run in a fresh store (judged or not)."""
    import mlflow

    from kbench import tracking

    with tempfile.TemporaryDirectory() as store:
        mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
        mlflow.set_experiment("feedback-benchmark")
        original = tracking.judge_trace
        if not judge:
            tracking.judge_trace = lambda *args, **kwargs: None
        try:
            with mlflow.start_run() as run:
                started = time.perf_counter()
                tracking.log_trajectories(records, run.info.run_id)
                return time.perf_counter() - started
        finally:
            tracking.judge_trace = original


def main() -> None:
    from kbench.records import read_traces

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a cell stage's output folder (artifacts/cells/<substrate>__s<seed>)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    records = read_traces(sorted(args.folder.rglob("traces.jsonl")))
    times: dict[str, list[float]] = {"plain": [], "judged": []}
    for _ in range(args.repeats):
        for mode in ("plain", "judged"):
            times[mode].append(timed_logging(records, judge=mode == "judged"))
    summary = {mode: {"mean_s": statistics.mean(v), "sd_s": statistics.stdev(v) if len(v) > 1 else 0.0, "runs": v}
               for mode, v in times.items()}
    summary["records"] = len(records)
    summary["feedback_s_per_trace"] = (summary["judged"]["mean_s"] - summary["plain"]["mean_s"]) / len(records)
    for mode in ("plain", "judged"):
        print(f"{mode:>6}: {summary[mode]['mean_s']:.2f} ± {summary[mode]['sd_s']:.2f} s for {len(records)} traces")
    print(f"feedback: {summary['feedback_s_per_trace'] * 1000:.1f} ms per trace")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
