"""The DVC remote round trip: `make run`'s DVC steps in one clone; clone again, `make setup`,
`dvc pull`, `kbench sync`; then `dvc repro` is a no-op and the MLflow store holds the same runs.

The pipeline is the project's own corpus stage on a 12-entity corpus, in a git repo with the
project's `.dvc/config`, so the shipped default remote (beside the clone) is what is tested,
and the steps are read from the Makefile, so what `make run` does is what is tested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO

#: The default remote's folder, beside the clone (`.dvc/config`: a url relative to .dvc/).
REMOTE_NAME = "kbench-dvc-remote"
#: Files a clone of the project carries that the corpus stage's DVC run needs.
PROJECT_FILES = (".dvc/config", ".dvcignore", ".gitignore", "data.dvc", "pipelines")


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "KBENCH_ROOT": str(cwd)}  # each clone has its own MLflow store
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _git(cwd: Path, *args: str) -> str:
    return _run(cwd, "git", "-c", "user.name=kbench", "-c", "user.email=kbench@localhost", *args)


def _stored_runs(root: Path) -> set[tuple]:
    """(kind, key, output hash, metrics) of every run in a clone's MLflow store."""
    script = (
        "import json, mlflow, sys\n"
        "mlflow.set_tracking_uri(sys.argv[1])\n"
        "runs = mlflow.search_runs(search_all_experiments=True, output_format='list')\n"
        "print(json.dumps([[r.data.tags['kbench.kind'], r.data.tags['kbench.key'],\n"
        "                   r.data.tags['kbench.output_hash'], sorted(r.data.metrics.items())] for r in runs]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, f"sqlite:///{root / 'mlflow.db'}"],
                         capture_output=True, text=True, check=True).stdout
    return {(kind, key, digest, tuple(map(tuple, metrics))) for kind, key, digest, metrics in yaml.safe_load(out)}


def make_run_steps() -> list[str]:
    """The commands of the Makefile's `run` recipe after `setup` (echoes left out)."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = lines.index("run: setup") + 1
    steps = []
    for line in lines[start:]:
        if not line.startswith("\t"):
            break
        if not line.startswith("\t@"):
            steps.append(line.strip().replace(".venv/bin/", f"{Path(sys.executable).parent}/"))
    return steps


def _setup(root: Path) -> None:
    """What `make setup` does to a clone: the data/ folder, and models/ built outside DVC (so
    not in its cache)."""
    (root / "data").mkdir(exist_ok=True)
    (root / "models/tiny").mkdir(parents=True)
    (root / "models/tiny/weights.bin").write_bytes(bytes(range(256)) * 64)


def _project(origin: Path) -> None:
    """A git repo holding the project's DVC setup, code and corpus stage, with 12 entities, and
    a DVC-tracked models/ folder that setup builds (as models.dvc is)."""
    origin.mkdir()
    _git(origin, "init", "-q")
    _run(origin, "dvc", "init", "-q")
    for name in PROJECT_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, origin / name)
        else:
            shutil.copy(REPO / name, origin / name)
    shutil.copytree(REPO / "src", origin / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    (origin / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"corpus": stages["corpus"]}}))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["corpus"]["n_entities"] = 12
    params["queries"]["n_per_split"] = 2  # the eval pools of 12 entities hold 4 forget queries
    (origin / "params.yaml").write_text(yaml.safe_dump(params))
    _setup(origin)
    _run(origin, "dvc", "add", "-q", "models")
    shutil.rmtree(origin / ".dvc/cache")  # as after `kbench setup`: in the work tree, not the cache


def test_a_fresh_clone_pulls_what_make_run_pushed(tmp_path):
    """Fails without a default remote (`dvc push` has nowhere to go) and without caching the
    inputs setup builds (`dvc pull` then misses models/ and exits 1)."""
    origin, clone, remote = tmp_path / "origin", tmp_path / "clone", tmp_path / REMOTE_NAME
    _project(origin)
    steps = make_run_steps()
    assert any(" push" in step for step in steps), f"make run pushes nothing: {steps}"
    output = "".join(_run(origin, "bash", "-c", step) for step in steps)
    assert "Running stage 'corpus'" in output
    assert remote.is_dir() and any(p.is_file() for p in remote.rglob("*")), "nothing reached the remote"
    assert not (origin / REMOTE_NAME).exists()  # the remote is outside the work tree
    _git(origin, "add", "-A")
    _git(origin, "commit", "-q", "-m", "run")
    pushed = _stored_runs(origin)
    assert {kind for kind, *_ in pushed} == {"corpus"}

    # A fresh clone beside it: no artifacts, no MLflow store, until pull and sync.
    _git(tmp_path, "clone", "-q", str(origin), str(clone))
    assert not (clone / "artifacts").exists() and not (clone / "mlflow.db").exists()
    _setup(clone)  # `make setup`
    _run(clone, "dvc", "pull")
    assert (clone / "artifacts/corpus/v1_facts.jsonl").read_bytes() == (
        origin / "artifacts/corpus/v1_facts.jsonl").read_bytes()
    _run(clone, "kbench", "sync")
    assert "Data and pipelines are up to date" in _run(clone, "dvc", "status")
    repro = _run(clone, "dvc", "repro")
    assert "Running stage" not in repro and "didn't change" in repro
    assert _stored_runs(clone) == pushed
