"""Read the finished cell runs of one design from MLflow (the only I/O of the comparison).

A store can hold the runs of several designs (the CPU default and the paper preset, say):
`select_design` keeps the runs of the design the params define and lists the others by key.
A cell key can have several runs of the design (a re-run after a code change, a `kbench sync`
in another clone); the latest finished one stands for the cell. Its trace records come from
the run's artifact `output/traces.jsonl` (docs/tracking.md), so every number of the report is
recomputed from the evidence MLflow holds, not from the metrics the cell logged.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kbench.comparison.analysis import CellRun
from kbench.design import Design
from kbench.records import read_traces
from kbench.tracking import (
    KIND_CELL,
    TAG_BASE_MODEL,
    TAG_BUDGET_EXCEPTIONS,
    TAG_CORPUS,
    TAG_DESIGN,
    TAG_KEY,
    TAG_KIND,
    TAG_METHOD,
    TAG_MODEL,
    TAG_N_PER_SPLIT,
    TAG_RECIPE,
    TAG_SEED,
    TAG_SUBSTRATE,
    TAG_UNLEARN_KEY,
    TRAJECTORIES_FILE,
)

CELL_KIND = KIND_CELL
TRACES_ARTIFACT = f"output/{TRAJECTORIES_FILE}"
#: Tags a cell run must carry (docs/tracking.md) and the CellRun field each one fills.
CELL_TAGS = {
    TAG_BASE_MODEL: "base_model",
    TAG_SUBSTRATE: "substrate",
    TAG_RECIPE: "recipe",
    TAG_METHOD: "method",
    TAG_SEED: "seed",
}


@dataclass(frozen=True)
class CellRunInfo:
    """What MLflow says about a cell run before its artifacts are read."""

    run_id: str
    key: str
    start_time: int  # ms since the epoch
    tags: dict[str, str]


def latest_per_key(runs: Iterable[CellRunInfo]) -> list[CellRunInfo]:
    """One run per cell key: the one started last (ties broken by run id, for determinism)."""
    latest: dict[str, CellRunInfo] = {}
    for run in runs:
        kept = latest.get(run.key)
        if kept is None or (run.start_time, run.run_id) > (kept.start_time, kept.run_id):
            latest[run.key] = run
    return [latest[key] for key in sorted(latest)]


@dataclass(frozen=True)
class OutOfDesign:
    """A cell key with a run that is not of the report's design (its latest such run), and why."""

    key: str
    run_id: str
    reason: str


@dataclass(frozen=True)
class DesignRuns:
    """The cell runs of one design, and the keys of the store's other runs."""

    #: The latest run of each cell key of the design, in key order.
    members: tuple[CellRunInfo, ...]
    #: One entry per cell key that has runs outside the design: the latest of them.
    others: tuple[OutOfDesign, ...]
    #: Corpus and model fingerprints of the design's cells (those of its newest run); None
    #: when the store holds no run of the design.
    corpus: str | None
    model: str | None


def _design_reason(info: CellRunInfo, design: Design) -> str | None:
    fields = _cell_fields(info)
    return design.excludes(
        base_model=str(fields["base_model"]), substrate=str(fields["substrate"]), recipe=str(fields["recipe"]),
        method=str(fields["method"]), seed=int(fields["seed"]),
        n_per_split=info.tags.get(TAG_N_PER_SPLIT), digest=info.tags.get(TAG_DESIGN),
    )


def select_design(runs: Iterable[CellRunInfo], design: Design) -> DesignRuns:
    """The runs of `design` (latest per cell key) and, by key, the runs of other designs.

    A run is of the design when its tags match the design's cells and conditions
    (`Design.excludes`) and it was measured on the design's corpus and model: the fingerprints
    of the design's newest run (so a run made before the code changed what the same params
    produce is left out too).
    """
    inside: list[CellRunInfo] = []
    reasons: dict[str, str] = {}
    outside: list[CellRunInfo] = []
    for run in runs:
        reason = _design_reason(run, design)
        if reason is None:
            inside.append(run)
        else:
            reasons[run.run_id] = reason
            outside.append(run)
    corpus = model = None
    kept = []
    if inside:
        newest = max(inside, key=lambda r: (r.start_time, r.run_id))
        corpus, model = newest.tags.get(TAG_CORPUS), newest.tags.get(TAG_MODEL)
        for run in inside:
            if run.tags.get(TAG_CORPUS) != corpus:
                reasons[run.run_id] = f"corpus fingerprint {run.tags.get(TAG_CORPUS)}, not {corpus} (the design's newest run)"
            elif run.tags.get(TAG_MODEL) != model:
                reasons[run.run_id] = f"model fingerprint {run.tags.get(TAG_MODEL)}, not {model} (the design's newest run)"
            else:
                kept.append(run)
                continue
            outside.append(run)
    others = tuple(OutOfDesign(r.key, r.run_id, reasons[r.run_id]) for r in latest_per_key(outside))
    return DesignRuns(tuple(latest_per_key(kept)), others, corpus, model)


def search_cell_runs(experiment_id: str) -> list[CellRunInfo]:
    """Every finished cell run of the experiment, re-runs included."""
    import mlflow

    runs = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`{TAG_KIND}` = '{CELL_KIND}' and attributes.status = 'FINISHED'",
        output_format="list",
    )
    return [
        CellRunInfo(run.info.run_id, run.data.tags[TAG_KEY], run.info.start_time, dict(run.data.tags))
        for run in runs
    ]


def _cell_fields(info: CellRunInfo) -> dict[str, str | int]:
    missing = [tag for tag in CELL_TAGS if tag not in info.tags]
    if missing:
        raise ValueError(f"cell run {info.run_id} ({info.key}) lacks the tag(s) {missing}; see docs/tracking.md")
    fields: dict[str, str | int] = {field: info.tags[tag] for tag, field in CELL_TAGS.items()}
    fields["seed"] = int(fields["seed"])
    return fields


def load_cell_run(info: CellRunInfo, scratch: Path) -> CellRun:
    """Download a run's trace records and check they belong to the cell its tags name."""
    import mlflow
    from mlflow.exceptions import MlflowException

    fields = _cell_fields(info)
    try:
        path = mlflow.artifacts.download_artifacts(
            run_id=info.run_id, artifact_path=TRACES_ARTIFACT, dst_path=str(scratch / info.run_id)
        )
    except MlflowException as exc:
        raise ValueError(f"cell run {info.run_id} ({info.key}) has no artifact {TRACES_ARTIFACT}: {exc}") from None
    records = tuple(read_traces([path]))
    for record in records:
        found = (record.substrate, record.method, record.seed)
        if found != (fields["substrate"], fields["method"], fields["seed"]):
            raise ValueError(
                f"cell run {info.run_id} ({info.key}) holds a trace of another cell "
                f"(substrate, method, seed) = {found} ({record.query_id})"
            )
    exceptions = json.loads(info.tags.get(TAG_BUDGET_EXCEPTIONS) or "{}")
    return CellRun(run_id=info.run_id, records=records, unlearned=info.tags.get(TAG_UNLEARN_KEY),  # type: ignore[arg-type]
                   budget_exceptions=tuple(sorted(exceptions.items())), **fields)


def collect_cells(experiment_id: str, design: Design) -> tuple[list[CellRun], DesignRuns]:
    """The latest finished run of every cell key of `design` in the experiment, with its trace
    records, and the selection that chose them (the runs of other designs, by key)."""
    # One progress bar per downloaded file would bury the stage's log; a user's setting wins.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    selection = select_design(search_cell_runs(experiment_id), design)
    with tempfile.TemporaryDirectory(prefix="kbench-compare-") as scratch:
        cells = [load_cell_run(info, Path(scratch)) for info in selection.members]
    return cells, selection
