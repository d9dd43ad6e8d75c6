"""The compare stage end to end: cell runs logged to a throwaway MLflow store (one only as a
DVC-tracked output folder, as after a cached stage or a fresh clone), `kbench compare`, the
files it writes, the `compare` run, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
from _comparison_cells import BASELINE_RETAIN, cell_run, design
from _traces import write_jsonl
from PIL import Image

from kbench import tracking
from kbench.comparison.analysis import CellRun, compare
from kbench.comparison.report import Provenance
from kbench.stages.compare import run_compare_stage, write_reports
from kbench.stages.compare import add_subcommands
from kbench.config import Params

CHROMIUM = Path("/usr/bin/chromium")


def _tags(cell: CellRun) -> dict[str, str]:
    return {
        "kbench.base_model": cell.base_model,
        "kbench.substrate": cell.substrate,
        "kbench.recipe": cell.recipe,
        "kbench.method": cell.method,
        "kbench.seed": str(cell.seed),
    }


def _key(cell: CellRun) -> str:
    return f"{cell.base_model}/{cell.substrate}/{cell.recipe}/{cell.method}/{cell.seed}"


def log_cell(params: Params, cell: CellRun, scratch: Path) -> str:
    """A cell run as the cell stage leaves it: tags and output/traces.jsonl."""
    folder = scratch / cell.run_id
    folder.mkdir(parents=True)
    write_jsonl(folder / "traces.jsonl", list(cell.records))
    with tracking.start_run(params, "cell", _key(cell), tags=_tags(cell)) as run:
        mlflow.log_artifact(str(folder / "traces.jsonl"), artifact_path="output")
        return run.info.run_id


def test_compare_stage_round_trip(kbench_root, caplog, capsys):
    params = Params()
    scratch = kbench_root / "scratch"
    c_cells = [
        c for c in design() if (c.substrate, c.recipe) == ("C", "none") and c.method in ("none", "eraser", "migrator")
    ]
    # An earlier run of the eraser's seed-0 cell that leaked everything: superseded below.
    stale = cell_run("eraser", "C", forget={"answer": 20}, retain=BASELINE_RETAIN)
    stale_id = log_cell(params, stale, scratch / "stale")
    time.sleep(0.01)  # start times are in ms: the re-run must start later
    run_ids = {_key(c): log_cell(params, c, scratch) for c in c_cells}
    ga = next(c for c in design() if c.method == "ga")
    run_ids[_key(ga)] = log_cell(params, ga, scratch)
    with pytest.raises(RuntimeError), tracking.start_run(params, "cell", "tiny/C/none/crashed/0", tags=_tags(ga)):
        raise RuntimeError("a cell that failed is not compared")
    # An R-struct baseline exists only as a DVC output folder with its manifest (no run yet).
    synced = cell_run("none", "R-struct", forget={"answer": 1, "clean": 1}, retain={"answer": 1})
    folder = kbench_root / "artifacts" / "cells" / "R-struct__none__none__s0"
    folder.mkdir(parents=True)
    write_jsonl(folder / "traces.jsonl", list(synced.records))
    tracking.write_manifest(folder, "cell", _key(synced), _tags(synced), {})

    with caplog.at_level(logging.WARNING, logger="kbench.stages.compare"):
        result = run_compare_stage(params, kbench_root / "reports")

    reports = kbench_root / "reports"
    for name in ("index.html", "leaderboard.md", "metrics.json", "comparison.json", "run.json",
                 "plots/k_score.png", "plots/attacker_budget.csv"):
        assert (reports / name).is_file(), name
    rows = {(r["key"]["substrate"], r["key"]["method"]): r
            for r in json.loads((reports / "comparison.json").read_text())["rows"]}
    assert set(rows) == {("C", "none"), ("C", "eraser"), ("C", "migrator"), ("R-struct", "none")}
    eraser = rows["C", "eraser"]
    assert eraser["run_ids"] == [run_ids["tiny/C/none/eraser/0"], run_ids["tiny/C/none/eraser/137"]]
    assert stale_id not in eraser["run_ids"] and eraser["verdict"]["verdict"] == "K-REF-inf"
    synced_run = tracking.find_run_id(tracking.open_experiment(params), "cell", _key(synced))
    assert rows["R-struct", "none"]["run_ids"] == [synced_run]
    assert result.cell_runs == 8  # 6 C runs, ga, the synced baseline; not the stale or crashed run

    html = (reports / "index.html").read_text()
    assert all(run_id in html for run_id in run_ids.values()) and synced_run in html
    assert "tiny/P/lora/ga" in html and "<script" not in html.lower()
    assert "no baseline for tiny/P/lora/ga" in caplog.text
    assert json.loads((reports / "metrics.json").read_text())["missing_baselines"] == 1
    assert "| eraser | none | K-REF-inf | 1.000 |" in (reports / "leaderboard.md").read_text()

    compare_run = mlflow.get_run(result.run_id)
    assert compare_run.data.tags[tracking.TAG_KIND] == tracking.KIND_COMPARE
    assert compare_run.data.metrics["cell_runs"] == 8
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(result.run_id, "output")}
    assert {"output/index.html", "output/leaderboard.md", "output/plots"} <= logged
    # Comparing again with nothing new reuses the compare run.
    assert run_compare_stage(params, reports).run_id == result.run_id

    # The command, pointed at a new experiment, first logs the DVC-tracked cell output there:
    # that is all this experiment holds.
    capsys.readouterr()
    (kbench_root / "params.yaml").write_text("{}\n")
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", default="params.yaml")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", "--out", "other-report", "--experiment", "other"])
    assert args.handler(args) == 0
    assert "1 rows from 1 cell runs, 0 without a baseline" in capsys.readouterr().out
    (only,) = json.loads((kbench_root / "other-report" / "comparison.json").read_text())["rows"]
    assert only["key"]["substrate"] == "R-struct" and only["run_ids"] != [synced_run]
    assert mlflow.get_run(only["run_ids"][0]).info.experiment_id == mlflow.get_experiment_by_name("other").experiment_id

    # A cell run without its trace records is an error that names the run, never a silent gap.
    other = params.model_copy(update={"tracking": params.tracking.model_copy(update={"experiment": "other"})})
    with tracking.start_run(other, "cell", _key(synced), tags=_tags(synced)) as empty_run:  # a re-run
        pass
    with pytest.raises(ValueError, match=f"{empty_run.info.run_id} .* has no artifact output/traces.jsonl"):
        run_compare_stage(other, kbench_root / "broken")


def test_report_renders_in_headless_chromium(tmp_path):
    assert CHROMIUM.exists(), "the HTML test needs Debian's chromium (apt-get install chromium)"
    write_reports(compare(design()), tmp_path / "reports", Provenance("kbench", "sqlite:///mlflow.db", 31, "abc"))
    html = tmp_path / "reports" / "index.html"
    assert "<script" not in html.read_text().lower()
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}", "--window-size=1280,2000", html.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Page errors (a script error, a resource that failed to load) are logged as CONSOLE lines.
    assert "CONSOLE" not in done.stderr and "Uncaught" not in done.stderr
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2000)
    pixels = np.asarray(image.resize((320, 500))).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50  # text, tables and plot colours: not a blank page
    assert (pixels != 255).any(axis=1).mean() > 0.05
