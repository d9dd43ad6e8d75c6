"""The `compare` stage (`kbench compare`): MLflow cell runs in, reports/ out, itself logged as a `compare` run."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.cli.app import add_command
from kbench.comparison.analysis import Comparison, compare
from kbench.comparison.collect import collect_cells
from kbench.comparison.plots import write_plots
from kbench.comparison.report import (
    Provenance,
    comparison_json,
    metrics_json,
    render_html,
    render_markdown,
)
from kbench.config import Params
from kbench.design import load_design

log = logging.getLogger(__name__)

COMMAND = "compare"
REPORTS_DIR = Path("reports")
#: Stage outputs that `sync_outputs` re-logs before comparing (cells cached by DVC, a fresh clone).
CELL_OUTPUT_ROOT = Path("artifacts")
HTML_FILE = "index.html"
MARKDOWN_FILE = "leaderboard.md"
METRICS_FILE = "metrics.json"
COMPARISON_FILE = "comparison.json"
PLOTS_DIR = "plots"


@dataclass(frozen=True)
class CompareResult:
    out_dir: Path
    run_id: str
    comparison: Comparison
    cell_runs: int


def _warn_missing(comparison: Comparison) -> None:
    for missing in comparison.missing:
        log.warning(
            "no baseline for %s: %s has no finished cell run, so this row gets no verdict (runs %s)",
            missing.key, missing.expected, ", ".join(missing.run_ids),
        )


def write_reports(comparison: Comparison, out_dir: Path, provenance: Provenance) -> None:
    """index.html, leaderboard.md, metrics.json, comparison.json and plots/ under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images = write_plots(comparison, out_dir / PLOTS_DIR)
    io.write_text(out_dir / HTML_FILE, render_html(comparison, images, provenance))
    io.write_text(out_dir / MARKDOWN_FILE, render_markdown(comparison, provenance))
    io.write_json(out_dir / METRICS_FILE, metrics_json(comparison), allow_nan=False)
    io.write_json(out_dir / COMPARISON_FILE, comparison_json(comparison), allow_nan=False)


def run_compare_stage(params: Params, out_dir: Path = REPORTS_DIR) -> CompareResult:
    """Sync cell outputs, read every finished cell run, write the reports, log the `compare` run."""
    synced = tracking.sync_outputs(params, [tracking.repo_root() / CELL_OUTPUT_ROOT])
    log.info("%d stage outputs under %s are in MLflow", len(synced), CELL_OUTPUT_ROOT)
    experiment_id = tracking.open_experiment(params)
    cells = collect_cells(experiment_id)
    if not cells:
        log.warning("experiment %r has no finished cell runs: the report is empty", params.tracking.experiment)
    comparison = compare(cells, params.scoring)
    _warn_missing(comparison)
    provenance = Provenance(
        experiment=params.tracking.experiment,
        tracking_uri=tracking.tracking_uri(params),
        cell_runs=len(cells),
        git_commit=tracking.git_commit(),
    )
    write_reports(comparison, out_dir, provenance)
    counts = metrics_json(comparison)
    summary = {
        "cell_runs": len(cells),
        "rows_compared": counts["rows_compared"],
        "verdict_flips_a1_a5": counts["verdict_flips_a1_a5"],
        "missing_baselines": counts["missing_baselines"],
        **{f"tau.{model}": tau for model, tau in counts["tau"].items() if tau is not None},
    }
    run_id = tracking.record_output(params, out_dir, tracking.KIND_COMPARE, params.tracking.experiment,
                                    tags={}, metrics=summary)
    log.info("comparison of %d cell runs in %s, MLflow run %s", len(cells), out_dir / HTML_FILE, run_id)
    return CompareResult(out_dir=out_dir, run_id=run_id, comparison=comparison, cell_runs=len(cells))


def cmd_compare(args: argparse.Namespace) -> int:
    params = load_design(args.params)
    if args.experiment:
        params = params.model_copy(update={"tracking": params.tracking.model_copy(update={"experiment": args.experiment})})
    result = run_compare_stage(params, Path(args.out))
    comparison = result.comparison
    print(
        f"{result.out_dir / HTML_FILE}: {len(comparison.rows)} rows from {result.cell_runs} cell runs, "
        f"{len(comparison.missing)} without a baseline; MLflow run {result.run_id}"
    )
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, COMMAND, cmd_compare, "leaderboards, verdicts, leak patterns and the HTML report from "
                    "the cell runs in MLflow", track=False)
    p.add_argument("--out", default=str(REPORTS_DIR), help="output folder (default: %(default)s)")
    p.add_argument("--experiment", help="MLflow experiment to read (default: tracking.experiment in params)")
