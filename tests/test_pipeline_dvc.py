"""`dvc repro` of the pipeline skeleton in a temporary copy of the project."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from conftest import REPO


def _dvc(root, *args):
    result = subprocess.run(["dvc", *args], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_repro_is_incremental(kbench_root):
    root = kbench_root
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "pipelines", root / "pipelines")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    _dvc(root, "init", "--no-scm", "-q")

    first = _dvc(root, "repro", "corpus")
    assert "Running stage 'corpus'" in first
    assert (root / "artifacts/corpus/v1_facts.jsonl").exists()

    second = _dvc(root, "repro", "corpus")
    assert "Running stage" not in second and "didn't change" in second

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["corpus"]["faker_seed"] = 1234
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    third = _dvc(root, "repro", "corpus")
    assert "Running stage 'corpus'" in third
