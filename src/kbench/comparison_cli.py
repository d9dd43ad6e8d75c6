"""`kbench compare`: the last pipeline stage (reports/ from every finished cell run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kbench.comparison.stage import REPORTS_DIR, run_compare


def cmd_compare(args: argparse.Namespace) -> int:
    from kbench.cli import read_params

    params = read_params(args)
    if args.experiment:
        params = params.model_copy(update={"tracking": params.tracking.model_copy(update={"experiment": args.experiment})})
    result = run_compare(params, Path(args.out))
    comparison = result.comparison
    print(
        f"{result.out_dir / 'index.html'}: {len(comparison.rows)} rows from {result.cell_runs} cell runs, "
        f"{len(comparison.missing)} without a baseline; MLflow run {result.run_id}"
    )
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="leaderboards, verdicts, leak patterns and the HTML report from the cell runs in MLflow"
    )
    p.add_argument("--out", default=str(REPORTS_DIR), help="output folder (default: %(default)s)")
    p.add_argument("--experiment", help="MLflow experiment to read (default: tracking.experiment in params)")
    p.set_defaults(handler=cmd_compare)
