"""`dvc repro` of the pipeline skeleton in a temporary copy of the project."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from kbench.config import CorpusConfig
from kbench.corpus import FACTS_FILE, generate_corpus, write_corpus
from kbench.stages.corpus import watched_by_dvc

from conftest import REPO


def _dvc(root, *args):
    result = subprocess.run(["dvc", *args], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _project(root: Path) -> Path:
    """The pipeline, its code and params, and the (empty) data folder of corpora, as `make run` has them."""
    for name in ("dvc.yaml", "params.yaml", "data.dvc"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "pipelines", root / "pipelines")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "data").mkdir()
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
