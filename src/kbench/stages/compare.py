"""The `compare` stage (`kbench compare`): MLflow cell runs in, reports/ out, itself logged as a `compare` run."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbench import io, tracking
from kbench.comparison.analysis import Comparison, compare
from kbench.comparison.collect import collect_cells
from kbench.comparison.plots import lane_plot_specs, write_plots
from kbench.comparison.report import (
    Provenance,
    ResultsHeader,
    comparison_record,
    metrics_json,
    render_html,
    render_markdown,
    render_results,
)
from kbench.config import Params
from kbench.corpus import corpus_names
from kbench.design import Design
from kbench.memory.report import tables as memory_tables
from kbench.memory.scoring import MemoryScores
from kbench.names import LANE_SCORES_FILE, PROBES_SUMMARY_FILE
from kbench.replay.report import sweep_summary
from kbench.replay.report import tables as replay_tables
from kbench.replay.scoring import SuiteScores
from kbench.stages import option
from kbench.versioned import VersionedFileError, read_versioned

log = logging.getLogger(__name__)

COMMAND = "compare"
HELP = "leaderboards, verdicts, leak patterns and the HTML report from the cell runs in MLflow"
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
    #: Cell keys of the experiment whose runs belong to other designs.
    not_in_design: int = 0


def _warn_missing(comparison: Comparison) -> None:
    for missing in comparison.missing:
        log.warning(
            "no baseline for %s: %s has no finished cell run, so this row gets no verdict (runs %s)",
            missing.key, missing.expected, ", ".join(missing.run_ids),
        )


@dataclass(frozen=True)
class LaneScores:
    """What the other two lanes' stages left for the report (each empty where its lane has not run)."""

    #: {suite label: the replay stage's scores}, sweep variants included.
    replay: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: {suite: `sweep_summary`} of the suites whose sweeps ran.
    sweeps: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: {system: the memory stage's scores}.
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)


def _scores(path: Path, stage: str) -> dict[str, Any] | None:
    """A lane's scores.json, validated against its model (the report reads its JSON shape); None if absent."""
    if not path.is_file():
        return None
    model = SuiteScores if stage == "replay" else MemoryScores
    try:
        return read_versioned(path, model, stage=stage).model_dump(mode="json")
    except VersionedFileError as exc:
        raise CompareError(str(exc)) from None


def lane_scores(params: Params) -> LaneScores:
    """The scores of `replay.suites` (with their sweeps) and of `memory.systems` found in the lanes' folders."""
    replay_dir, memory_dir = Path(params.replay.out_dir), Path(params.memory.out_dir)
    replay = {label: found for label in params.replay.labels()
              if (found := _scores(replay_dir / label / LANE_SCORES_FILE, "replay")) is not None}
    sweeps = {suite: found for suite in params.replay.suites
              if (found := sweep_summary(suite, replay, tau=params.replay.tau, indep=params.replay.indep))}
    memory = {system: found for system in params.memory.systems
              if (found := _scores(memory_dir / system / LANE_SCORES_FILE, "memory")) is not None}
    if not replay or not memory:
        log.info("the report shows %s", " and ".join(
            f"no {name} lane (run `dvc repro {stage}`)" for name, stage, got in
            (("execution-state", "replay", replay), ("memory", "memory_report", memory)) if not got))
    return LaneScores(replay, sweeps, memory)


def write_reports(comparison: Comparison, out_dir: Path, provenance: Provenance,
                  probes: dict[str, Any] | None = None, lanes: LaneScores | None = None) -> None:
    """index.html, leaderboard.md, metrics.json, comparison.json and plots/ under out_dir;
    `probes`: the probes stage's summary, set beside the observer's rows; `lanes`: the other
    lanes' scores, each lane a section of index.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lanes = lanes or LaneScores()
    images = write_plots(comparison, out_dir / PLOTS_DIR, lane_plot_specs(lanes.memory, lanes.sweeps))
    tables = {"replay": replay_tables(lanes.replay, lanes.sweeps) if lanes.replay else [],
              "memory": memory_tables(lanes.memory) if lanes.memory else []}
    io.write_text(out_dir / HTML_FILE, render_html(comparison, images, provenance, probes, tables))
    io.write_text(out_dir / MARKDOWN_FILE, render_markdown(comparison, provenance, probes))
    io.write_json(out_dir / METRICS_FILE, metrics_json(comparison), allow_nan=False)
    io.write_json(out_dir / COMPARISON_FILE, comparison_record(comparison, provenance, probes).model_dump(mode="json"),
                  allow_nan=False)


def write_results(comparison: Comparison, path: Path, header: ResultsHeader,
                  probes: dict[str, Any] | None = None) -> None:
    """The design's results page (`report.results`, docs/results.md by default)."""
    io.write_text(path, render_results(comparison, header, probes))
    log.info("results page %s", path)


def probe_summary(params: Params) -> dict[str, Any] | None:
    """The probes stage's summary.json of this design, or None when it has not run."""
    path = Path(params.probes.out_dir) / PROBES_SUMMARY_FILE
    if not path.exists():
        log.info("no %s: the report has no probe tables (run `kbench probes`)", path)
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompareError(f"{path} is unreadable ({exc}); rerun `kbench probes`") from None


def compared_models(params: Params) -> list[Design]:
    """The design on each base model of `report.models` (its `model.path`), to read beside its own."""
    return [Design.of(params.model_copy(update={"model": params.model.model_copy(update={"path": path})}))
            for path in params.report.models]


class CompareError(ValueError):
    """An input of the comparison is unreadable."""


def run_compare_stage(params: Params, out_dir: Path = REPORTS_DIR) -> CompareResult:
    """Sync cell outputs, read the finished cell runs of the params' design, write the
    reports, log the `compare` run."""
    synced = tracking.sync_outputs(params, [tracking.repo_root() / CELL_OUTPUT_ROOT])
    log.info("%d stage outputs under %s are in MLflow", len(synced), CELL_OUTPUT_ROOT)
    experiment_id = tracking.open_experiment(params)
    design = Design.of(params)
    cells, selection = collect_cells(experiment_id, design)
    for other in compared_models(params):  # report.models: the same design on other base models
        found, theirs = collect_cells(experiment_id, other)
        log.info("%d cell runs of this design on base model %s", len(found), other.base_model)
        cells += found
        read = {member.key for member in theirs.members}
        selection = dataclasses.replace(selection, others=tuple(o for o in selection.others if o.key not in read))
    if not cells:
        log.warning("experiment %r has no finished cell runs of this design: the report is empty",
                    params.tracking.experiment)
    if selection.others:
        log.info("%d cell key(s) of the experiment have runs of another design; they are left out",
                 len(selection.others))
    names = corpus_names()
    if names is None:
        log.info("no corpus at the corpus stage's folder: no answer is judged a name binding")
    comparison = compare(cells, params.scoring, names)
    _warn_missing(comparison)
    provenance = Provenance(
        experiment=params.tracking.experiment,
        tracking_uri=tracking.tracking_uri(params),
        cell_runs=len(cells),
        git_commit=tracking.git_commit(),
        design=design.describe(),
        corpus=selection.corpus,
        model=selection.model,
        not_in_design=selection.others,
    )
    probes = probe_summary(params)
    write_reports(comparison, out_dir, provenance, probes, lane_scores(params))
    header = ResultsHeader(digest=design.digest, n_per_split=design.n_per_split, seeds=design.seeds,
                           model=params.base_model, corpus=selection.corpus)
    write_results(comparison, Path(params.report.results), header, probes)
    counts = metrics_json(comparison)
    summary = {
        "cell_runs": len(cells),
        "rows_compared": counts["rows_compared"],
        "verdict_flips_a1_a5": counts["verdict_flips_a1_a5"],
        "missing_baselines": counts["missing_baselines"],
        "not_in_design": len(selection.others),
        **{f"tau.{model}": tau for model, tau in counts["tau"].items() if tau is not None},
    }
    run_id = tracking.record_output(params, out_dir, tracking.KIND_COMPARE, params.tracking.experiment,
                                    tags={tracking.TAG_DESIGN: design.digest}, metrics=summary)
    log.info("comparison of %d cell runs in %s, MLflow run %s", len(cells), out_dir / HTML_FILE, run_id)
    return CompareResult(out_dir=out_dir, run_id=run_id, comparison=comparison, cell_runs=len(cells),
                         not_in_design=len(selection.others))


@dataclass(frozen=True)
class Options:
    """`kbench compare`'s options."""

    #: Where the reports are written.
    out: Path = option(REPORTS_DIR, "output folder")
    #: The MLflow experiment read instead of `tracking.experiment`.
    experiment: str | None = option(None, "MLflow experiment to read (default: tracking.experiment in params)")


def main(params: Params, options: Options) -> int:
    if options.experiment:
        params = params.model_copy(update={"tracking": params.tracking.model_copy(update={"experiment": options.experiment})})
    result = run_compare_stage(params, options.out)
    comparison = result.comparison
    print(
        f"{result.out_dir / HTML_FILE}: {len(comparison.rows)} rows from {result.cell_runs} cell runs, "
        f"{len(comparison.missing)} without a baseline, {result.not_in_design} cell key(s) of other designs "
        f"left out; MLflow run {result.run_id}"
    )
    return 0
