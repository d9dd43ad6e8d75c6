"""The compare stage end to end: cell runs logged to a throwaway MLflow store (one only as a
DVC-tracked output folder, as after a cached stage or a fresh clone), `kbench compare`, the
files it writes, the `compare` run, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml
from _comparison_cells import BASELINE_RETAIN, cell_run, design
from _hash_seed import run_under_hash_seeds
from _traces import write_jsonl
from PIL import Image

from kbench import tracking
from kbench.comparison.analysis import CellRun, compare
from kbench.comparison.report import Provenance
from kbench.config import Params, parse_params
from kbench.design import Design
from kbench.stages.cell import CellSpec, cell_tags
from kbench.cli.main import build_parser, main
from kbench.stages.compare import run_compare_stage, write_reports

CHROMIUM = Path("/usr/bin/chromium")
#: The corpus and model fingerprints the hand-made cell runs claim.
CORPUS, MODEL = "corpus-fp", "model-fp"


def tiny_params(**overrides) -> Params:
    """The design of tests/_comparison_cells.py: base model `tiny`, seeds 0 and 137, n = 20."""
    data = {
        "model": {"path": "models/tiny"}, "seeds": [0, 137], "queries": {"n_per_split": 20},
        "methods": ["none", "eraser", "halver", "migrator", "ga"], "substrates": ["C", "R-text", "R-struct"],
    }
    return parse_params({**data, **overrides})


def _tags(cell: CellRun, params: Params) -> dict[str, str]:
    """The tags the cell stage writes (`cell_tags`), for a cell run of `params`."""
    return cell_tags(params, CellSpec(cell.substrate, cell.method, cell.seed, cell.recipe), CORPUS, MODEL)


def _key(cell: CellRun) -> str:
    return f"{cell.base_model}/{cell.substrate}/{cell.recipe}/{cell.method}/{cell.seed}"


def log_cell(params: Params, cell: CellRun, scratch: Path, tags: dict[str, str] | None = None) -> str:
    """A cell run as the cell stage leaves it: tags and output/traces.jsonl."""
    folder = scratch / cell.run_id
    folder.mkdir(parents=True)
    write_jsonl(folder / "traces.jsonl", list(cell.records))
    with tracking.start_run(params, "cell", _key(cell), tags=tags or _tags(cell, params)) as run:
        mlflow.log_artifact(str(folder / "traces.jsonl"), artifact_path="output")
        return run.info.run_id


def test_the_cell_stage_tags_make_a_run_part_of_its_design():
    params = tiny_params()
    tags = _tags(next(c for c in design() if c.method == "ga"), params)
    design_of = Design.of(params)
    assert tags[tracking.TAG_DESIGN] == design_of.digest and tags[tracking.TAG_N_PER_SPLIT] == "20"
    assert tags[tracking.TAG_MODEL] == MODEL and tags[tracking.TAG_CORPUS] == CORPUS
    parts = dict(base_model=tags[tracking.TAG_BASE_MODEL], substrate="P", recipe="lora", method="ga", seed=0,
                 n_per_split=tags[tracking.TAG_N_PER_SPLIT], digest=tags[tracking.TAG_DESIGN])
    assert design_of.excludes(**parts) is None
    assert "n_per_split 20, not 10" in Design.of(tiny_params(queries={"n_per_split": 10})).excludes(**parts)
    other_agent = Design.of(tiny_params(agent={"max_iters": 3}))
    assert "design digest" in other_agent.excludes(**parts)
    assert "seed 0 is not in the design" in Design.of(tiny_params(seeds=[137])).excludes(**parts)
    assert "recipe lora of P" in Design.of(tiny_params(p_recipes=["merged"])).excludes(**parts)
    assert "no design tags" in design_of.excludes(**{**parts, "digest": None})
    # The LoRA-D control is in every design that has its substrate, with method none only.
    control = dict(parts, substrate="C", recipe="lora-d", method="none")
    assert design_of.excludes(**control) is None
    assert "runs none only" in design_of.excludes(**dict(control, method="eraser"))
    # The cell list, seeds and scoring are not in the digest: adding a method keeps old cells.
    assert Design.of(tiny_params(methods=["none"], scoring={"significance": 0.01})).digest == design_of.digest


def test_compare_stage_round_trip(kbench_root, caplog, capsys):
    params = tiny_params()
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
    with pytest.raises(RuntimeError), tracking.start_run(params, "cell", "tiny/C/none/crashed/0", tags=_tags(ga, params)):
        raise RuntimeError("a cell that failed is not compared")
    # An R-struct baseline exists only as a DVC output folder with its manifest (no run yet).
    synced = cell_run("none", "R-struct", forget={"answer": 1, "clean": 1}, retain={"answer": 1})
    folder = kbench_root / "artifacts" / "cells" / "R-struct__none__none__s0"
    folder.mkdir(parents=True)
    write_jsonl(folder / "traces.jsonl", list(synced.records))
    tracking.write_manifest(folder, "cell", _key(synced), _tags(synced, params), {})

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
    assert "| eraser | none | K-REF-inf | no-op on retain |  | 1.000 |" in (reports / "leaderboard.md").read_text()

    # The results page (report.results): the design once at the top, the leaderboards, no run id.
    page = (kbench_root / "docs" / "results.md").read_text()
    assert f"**Design** `{Design.of(params).digest}`" in page
    assert "20 forget and 20 retain queries per seed and cell · seeds 0, 137" in page
    assert "| eraser | K-REF-inf | 1.000 |" in page
    assert not [run for run in [*run_ids.values(), synced_run] if run in page]

    compare_run = mlflow.get_run(result.run_id)
    assert compare_run.data.tags[tracking.TAG_KIND] == tracking.KIND_COMPARE
    assert compare_run.data.metrics["cell_runs"] == 8
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(result.run_id, "output")}
    assert {"output/index.html", "output/leaderboard.md", "output/plots"} <= logged
    # Comparing again with nothing new reuses the compare run and writes the same results page.
    assert run_compare_stage(params, reports).run_id == result.run_id
    assert (kbench_root / "docs" / "results.md").read_text() == page

    # The command, pointed at a new experiment, first logs the DVC-tracked cell output there:
    # that is all this experiment holds.
    capsys.readouterr()
    # The command checks the params' methods against the registry: this design runs `none` only.
    (kbench_root / "params.yaml").write_text(yaml.safe_dump(tiny_params(methods=["none"]).model_dump(mode="json")))
    assert main(["compare", "--out", "other-report", "--experiment", "other"]) == 0
    assert "1 rows from 1 cell runs, 0 without a baseline" in capsys.readouterr().out
    (only,) = json.loads((kbench_root / "other-report" / "comparison.json").read_text())["rows"]
    assert only["key"]["substrate"] == "R-struct" and only["run_ids"] != [synced_run]
    assert mlflow.get_run(only["run_ids"][0]).info.experiment_id == mlflow.get_experiment_by_name("other").experiment_id

    # A cell run without its trace records is an error that names the run, never a silent gap.
    other = params.model_copy(update={"tracking": params.tracking.model_copy(update={"experiment": "other"})})
    with tracking.start_run(other, "cell", _key(synced), tags=_tags(synced, params)) as empty_run:  # a re-run
        pass
    with pytest.raises(ValueError, match=f"{empty_run.info.run_id} .* has no artifact output/traces.jsonl"):
        run_compare_stage(other, kbench_root / "broken")


def test_a_store_with_two_designs_gives_two_reports_with_separate_families(kbench_root, capsys):
    # Design A: tests/_comparison_cells.py on C (n = 20, seeds 0 and 137, four methods).
    params_a = tiny_params(methods=["none", "eraser", "halver", "migrator"])
    cells_a = [c for c in design() if (c.substrate, c.recipe) == ("C", "none") and c.method in params_a.methods]
    ids_a = {log_cell(params_a, c, kbench_root / "a") for c in cells_a}
    # A later run of one of A's cells without design tags (as made before cells carried them)
    # belongs to no design: it must not stand for the cell although it is the latest.
    time.sleep(0.01)
    old = cell_run("halver", "C", seed=0, forget={"clean": 20}, retain=BASELINE_RETAIN)
    old_tags = {k: v for k, v in _tags(old, params_a).items() if k not in (tracking.TAG_DESIGN, tracking.TAG_N_PER_SPLIT)}
    old_id = log_cell(params_a, old, kbench_root / "old", tags=old_tags)
    # Design B, logged later into the same experiment: n = 10 on seed 0, the baseline and gold
    # on P and a C baseline whose key collides with one of design A's.
    params_b = tiny_params(seeds=[0], queries={"n_per_split": 10}, methods=["none", "gold"], p_recipes=["lora"])
    time.sleep(0.01)
    cells_b = [
        cell_run("none", "P", recipe="lora", forget={"answer": 10}, retain={"answer": 10}),
        cell_run("gold", "P", recipe="lora", forget={"clean": 10}, retain={"answer": 10}),
        cell_run("none", "C", forget={"answer": 10}, retain={"answer": 10}),
    ]
    ids_b = {log_cell(params_b, c, kbench_root / "b") for c in cells_b}

    result_a = run_compare_stage(params_a, kbench_root / "report-a")
    report_a = json.loads((kbench_root / "report-a" / "comparison.json").read_text())
    assert {run for r in report_a["rows"] for run in r["run_ids"]} == ids_a
    # BH over design A's three forget tests alone: the numbers of comparing A's cells by themselves.
    alone = {r.key.method: r for r in compare(cells_a, params_a.scoring).rows}
    for r in result_a.comparison.rows:
        assert r.verdict.p_adj == pytest.approx(alone[r.key.method].verdict.p_adj)
        assert r.p_adj_retain == pytest.approx(alone[r.key.method].p_adj_retain)
    assert {o["key"]: o["reason"] for o in report_a["not_in_design"]} == {
        "tiny/P/lora/none/0": "n_per_split 10, not 20",
        "tiny/P/lora/gold/0": "method gold is not in the design",  # the first difference found
        "tiny/C/none/none/0": "n_per_split 10, not 20",
        "tiny/C/none/halver/0": "the run carries no design tags (it predates them)",
    }
    assert old_id not in {run for r in report_a["rows"] for run in r["run_ids"]}
    html = (kbench_root / "report-a" / "index.html").read_text()
    assert "Not in this design" in html and "tiny/P/lora/gold/0" in html
    assert "Not in this design" in (kbench_root / "report-a" / "leaderboard.md").read_text()
    assert report_a["design"] == {"description": Design.of(params_a).describe(), "corpus": CORPUS, "model": MODEL}

    # `kbench compare --params FILE` reports design B from the same store; the global
    # --params stays what it was when the subcommand does not repeat it.
    file_b = kbench_root / "b.yaml"
    file_b.write_text(yaml.safe_dump(params_b.model_dump(mode="json")))
    parser = build_parser()
    assert parser.parse_args(["--params", "x.yaml", "compare"]).params == "x.yaml"
    args = parser.parse_args(["--params", "x.yaml", "compare", "--params", str(file_b), "--out", "report-b"])
    assert args.params == str(file_b)
    assert args.handler(args) == 0
    assert "3 rows from 3 cell runs, 0 without a baseline" in capsys.readouterr().out
    report_b = json.loads((kbench_root / "report-b" / "comparison.json").read_text())
    rows_b = {(r["key"]["substrate"], r["key"]["method"]): r for r in report_b["rows"]}
    assert set(rows_b) == {("P", "none"), ("P", "gold"), ("C", "none")}
    assert {run for r in report_b["rows"] for run in r["run_ids"]} == ids_b
    # Gold is design B's only test: a family of one, p_adj = p = 2 · ½¹⁰.
    gold = rows_b["P", "gold"]["verdict"]
    assert gold["p"] == pytest.approx(2 * 0.5**10) and gold["p_adj"] == gold["p"]
    assert {o["key"] for o in report_b["not_in_design"]} == {_key(c) for c in cells_a}


def test_runs_of_another_corpus_under_the_same_params_are_left_out(kbench_root):
    params = tiny_params(methods=["none", "eraser"])
    cells = [c for c in design() if (c.substrate, c.recipe) == ("C", "none") and c.method in params.methods]
    stale = log_cell(params, cells[0], kbench_root / "stale", tags={**_tags(cells[0], params), tracking.TAG_CORPUS: "older"})
    time.sleep(0.01)
    fresh = {log_cell(params, c, kbench_root / "fresh") for c in cells}
    result = run_compare_stage(params, kbench_root / "reports")
    assert {run for r in result.comparison.rows for run in r.run_ids} == fresh
    report = json.loads((kbench_root / "reports" / "comparison.json").read_text())
    (left_out,) = report["not_in_design"]
    assert left_out["run_id"] == stale and "corpus fingerprint older, not corpus-fp" in left_out["reason"]


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


def test_every_report_file_is_the_same_bytes_under_every_string_hash_seed(tmp_path):
    """No report (HTML, markdown, metrics, comparison, plots) may follow a set's order, which
    follows PYTHONHASHSEED: each seed writes the reports of one design in its own process."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from pathlib import Path\n"
        "from _comparison_cells import design\n"
        "from kbench.comparison.analysis import compare\n"
        "from kbench.comparison.report import Provenance\n"
        "from kbench.stages.compare import write_reports\n"
        "write_reports(compare(design()), Path(sys.argv[1]), Provenance('kbench', 'sqlite:///mlflow.db', 31, 'abc'))\n"
        "from kbench.comparison.report import ResultsHeader\n"
        "from kbench.stages.compare import write_results\n"
        "write_results(compare(design()), Path(sys.argv[1]) / 'results.md', ResultsHeader('d', 20, (0, 137), 'tiny', 'c'))\n"
    )
    tests = Path(__file__).resolve().parent
    seeds = range(4)  # a set of three names takes one of six orders per seed
    run_under_hash_seeds(code, seeds, lambda seed: (str(tmp_path / str(seed)), str(tests)), MPLBACKEND="Agg")
    written = {seed: {p.relative_to(tmp_path / str(seed)).as_posix(): p.read_bytes()
                      for p in sorted((tmp_path / str(seed)).rglob("*")) if p.is_file()} for seed in seeds}
    assert len(written[0]) > 4 and any(name.endswith(".png") for name in written[0]) and "results.md" in written[0]
    for seed, files in written.items():
        assert files.keys() == written[0].keys(), seed
        assert [name for name in files if files[name] != written[0][name]] == [], f"PYTHONHASHSEED={seed}"


GOLDEN_RESULTS = Path(__file__).resolve().parent / "golden" / "results.md"


def test_the_results_page_of_the_fixture_design_is_the_committed_one():
    """docs/results.md's writer on tests/_comparison_cells.py's design, against the page committed
    beside this test (rewrite it with KBENCH_UPDATE_GOLDEN=1 after a deliberate change, and read the diff)."""
    from kbench.comparison.report import ResultsHeader, render_results

    page = render_results(compare(design()), ResultsHeader("0123456789abcdef", 20, (0, 137), "tiny", CORPUS))
    if os.environ.get("KBENCH_UPDATE_GOLDEN"):
        GOLDEN_RESULTS.parent.mkdir(exist_ok=True)
        GOLDEN_RESULTS.write_text(page, encoding="utf-8")
    assert page == GOLDEN_RESULTS.read_text(encoding="utf-8")


def test_report_models_reads_the_same_design_on_another_base_model(kbench_root):
    """`report.models`: the comparison reads this design's runs on the base models named there
    too, and shows the verdicts side by side; without it, the other model's runs are out of design."""
    params = tiny_params(methods=["none", "eraser", "halver"], substrates=["C"])
    on_tiny = [c for c in design() if (c.substrate, c.recipe) == ("C", "none") and c.method in params.methods]
    other_params = params.model_copy(update={"model": params.model.model_copy(update={"path": "models/other"})})
    on_other = [dataclasses.replace(c, base_model="other", run_id=f"other-{c.run_id}") for c in on_tiny]
    for params_of, cells, folder in ((params, on_tiny, "tiny"), (other_params, on_other, "other")):
        for cell in cells:
            log_cell(params_of, cell, kbench_root / folder)

    alone = run_compare_stage(params, kbench_root / "alone")
    assert alone.comparison.models is None and alone.cell_runs == len(on_tiny)
    assert alone.not_in_design == len(on_other)  # the other model's cells, by key

    both = run_compare_stage(params.model_copy(update={"report": params.report.model_copy(
        update={"models": ["models/other"]})}), kbench_root / "both")
    assert both.cell_runs == len(on_tiny) + len(on_other) and both.not_in_design == 0
    assert both.comparison.models.models == ("other", "tiny") and both.comparison.models.disagreements == 0
    assert "Across base models" in (kbench_root / "both" / "index.html").read_text()
