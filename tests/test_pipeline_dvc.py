"""`dvc repro` of the pipeline skeleton in a temporary copy of the project."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kbench import tracking
from kbench.config import CorpusConfig
from kbench.corpus import FACTS_FILE, generate_corpus, write_corpus
from kbench.design import Design, load_design
from kbench.servers import free_port
from kbench.stages.compare import run_compare_stage
from kbench.stages.corpus import watched_by_dvc

from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from conftest import REPO


def _dvc(root, *args, env=None):
    result = subprocess.run(["dvc", *args], cwd=root, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _project(root: Path, *, git: bool = False) -> Path:
    """The pipeline, its code and params, and the (empty) data folder of corpora, as `make run` has
    them; `git`: in a git repository with everything committed (DVC experiments need one)."""
    for name in ("dvc.yaml", "params.yaml", "data.dvc", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "pipelines", root / "pipelines")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "data").mkdir()
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        _dvc(root, "init", "-q")
    else:
        _dvc(root, "init", "--no-scm", "-q")
    return root


def _set_corpus(root: Path, **values) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["corpus"].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def _corpus_out_md5(root: Path) -> str:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return lock["stages"]["corpus"]["outs"][0]["md5"]


def test_repro_is_incremental(kbench_root):
    root = _project(kbench_root)
    first = _dvc(root, "repro", "corpus")
    assert "Running stage 'corpus'" in first
    assert (root / "artifacts/corpus/v1_facts.jsonl").exists()

    second = _dvc(root, "repro", "corpus")
    assert "Running stage" not in second and "didn't change" in second

    _set_corpus(root, faker_seed=1234)
    third = _dvc(root, "repro", "corpus")
    assert "Running stage 'corpus'" in third


def test_a_corpus_replaced_in_place_under_data_reruns_what_it_must(kbench_root):
    """corpus.source: data/mine; a new corpus copied over the old one (same path, same params)
    reruns the corpus stage; a corpus added beside it reruns the stage without changing its output."""
    root = _project(kbench_root)
    source = root / "data/mine"
    write_corpus(generate_corpus(CorpusConfig(n_entities=20, faker_seed=1)), source)
    _set_corpus(root, source="data/mine")
    assert "Running stage 'corpus'" in _dvc(root, "repro", "corpus")
    first = _corpus_out_md5(root)

    write_corpus(generate_corpus(CorpusConfig(n_entities=20, faker_seed=2)), source)
    assert "Running stage 'corpus'" in _dvc(root, "repro", "corpus")
    assert (root / "artifacts/corpus" / FACTS_FILE).read_bytes() == (source / FACTS_FILE).read_bytes()
    second = _corpus_out_md5(root)
    assert second != first

    # Another corpus beside the source: the stage reruns, its output (what every later stage
    # depends on) stays the same, so nothing downstream reruns.
    write_corpus(generate_corpus(CorpusConfig(n_entities=20, faker_seed=3)), root / "data/other")
    _dvc(root, "repro", "corpus")
    assert _corpus_out_md5(root) == second


def test_only_a_source_under_data_is_watched_by_dvc(kbench_root):
    (kbench_root / "data/mine").mkdir(parents=True)
    assert watched_by_dvc("data/mine") and watched_by_dvc(str(kbench_root / "data/mine"))
    assert not watched_by_dvc("../shared/data/kbench-v1") and not watched_by_dvc("corpora/mine")
    assert not watched_by_dvc("data-old/mine")


def _tiny_design(root: Path, model: Path, **changes) -> dict:
    """params.yaml of a one-cell design (C, the baseline, 20 people) on `model`."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(substrates=["C"], methods=["none"], p_recipes=[], **changes)
    params["corpus"]["n_entities"] = 20
    params["agent_base"]["enabled"] = False
    params["model"]["path"] = str(model)
    params["agent"].update(max_iters=1, max_new_tokens=8, summary_max_new_tokens=8)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return params


@pytest.mark.slow
def test_switching_back_to_a_model_with_its_own_cells_folder_keeps_its_cells(
        kbench_root, tiny_model_dir, tmp_path_factory):  # noqa: F811
    """Two models, each writing its cells to its own `cells.out_dir` (as the Gemma presets do):
    after the other model's run, switching back reruns the persisted cell stage (DVC's run cache
    skips persisted stages), which finds its traces made from the same inputs and keeps them."""
    root = _project(kbench_root)
    other = tmp_path_factory.mktemp("other") / "model"
    shutil.copytree(tiny_model_dir, other)  # the same weights under another path: another design
    _tiny_design(root, tiny_model_dir)
    _dvc(root, "repro", "cell")
    traces = root / "artifacts/cells/C__s0/none/none/traces.jsonl"
    first = (traces.read_bytes(), traces.stat().st_mtime_ns)

    _tiny_design(root, other, cells={"out_dir": "artifacts/other/cells", "controls_dir": "artifacts/other/controls"})
    _dvc(root, "repro", "cell")
    assert (root / "artifacts/other/cells/C__s0/none/none/traces.jsonl").exists()

    _tiny_design(root, tiny_model_dir)
    again = _dvc(root, "repro", "cell")
    assert "Running stage 'cell@C-0'" in again  # persisted: DVC reruns it, the stage resumes
    assert (traces.read_bytes(), traces.stat().st_mtime_ns) == first


def _git_commit(root: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=root, check=True)


def _wait_for_queue(root: Path, env: dict[str, str], timeout: float = 900.0) -> str:
    """`dvc queue status` once no task is queued or running."""
    deadline = time.monotonic() + timeout
    while True:
        status = _dvc(root, "queue", "status", env=env)
        if not any(word in status for word in ("Queued", "Running")) or time.monotonic() > deadline:
            return status
        time.sleep(1)


@pytest.mark.slow
def test_a_sweep_queued_with_dvc_runs_in_parallel_and_each_comparison_reads_its_own_runs(
        tmp_path, tiny_model_dir, monkeypatch):  # noqa: F811
    """README's sweep: two designs queued with `dvc exp run --queue -S`, run side by side by
    `dvc queue start -j 2` (each in DVC's temporary workspace) and logged to one tracking server;
    the comparison of each design reads its own cell runs from the server by design digest."""
    (tmp_path / "project").mkdir()
    root = _project(tmp_path / "project", git=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params.update(substrates=["C"], methods=["none"], p_recipes=[])
    params["corpus"]["n_entities"] = 20
    params["agent_base"]["enabled"] = False
    params["model"]["path"] = str(tiny_model_dir)
    params["agent"].update(max_iters=1, max_new_tokens=8, summary_max_new_tokens=8)
    params["tracking"]["experiment"] = "sweep"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git_commit(root, "tiny design")

    env = {key: value for key, value in os.environ.items() if key != "KBENCH_ROOT"}  # each stage: its workspace
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@localhost", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@localhost")
    with tracking.tracking_server(tmp_path, free_port()) as uri:
        env["MLFLOW_TRACKING_URI"] = uri
        for n in (1, 2):
            _dvc(root, "exp", "run", "--queue", "-S", f"queries.n_per_split={n}", "-n", f"n{n}", "cell", env=env)
        try:
            _dvc(root, "queue", "start", "-j", "2", env=env)
            status = _wait_for_queue(root, env)
        finally:
            subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=root, env=env, capture_output=True)
        assert status.count("Success") == 2, status + _dvc(root, "queue", "logs", "n1", env=env)
        shown = json.loads(_dvc(root, "exp", "show", "--json", env=env))
        names = {exp.get("name") for commit in shown for exp in (commit.get("experiments") or [])}
        assert {"n1", "n2"} <= names, shown

        # The comparison of each design, in a folder with no stage outputs: what it reads is the server's.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("KBENCH_ROOT", str(tmp_path / "reader"))
        (tmp_path / "reader").mkdir()
        monkeypatch.chdir(tmp_path / "reader")
        digests = set()
        for n in (1, 2):
            params["queries"]["n_per_split"] = n
            (tmp_path / "reader" / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            design = load_design(tmp_path / "reader" / "params.yaml")
            result = run_compare_stage(design, tmp_path / "reader" / f"reports-n{n}")
            assert (result.cell_runs, result.not_in_design) == (1, 1)  # its own cell; the other design's left out
            rows = result.comparison.rows
            assert rows and all(row.forget.n == row.retain.n == n for row in rows)
            digests.add(Design.of(design).digest)
        assert len(digests) == 2
