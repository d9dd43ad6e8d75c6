"""One invalidation layer: dvc.yaml's params of every stage are the table in
`kbench.stages.inputs`, and the resume digest of a cell, a probed model and an unlearn run takes
that table's shaping keys, so a key that shapes no cell keeps every finished one and a key that
shapes some reruns exactly those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from kbench import io
from kbench.config import Params
from kbench.design import DESIGN_SECTIONS, load_design
from kbench.methods import method_class
from kbench.stages.cell import CellSpec, _inputs_fingerprint
from kbench.stages.inputs import METHOD_PARAMS, STAGE_INPUTS, shaping

ROOT = Path(__file__).resolve().parents[1]


def _dvc_params() -> dict[str, list[str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: list(stage.get("params", [])) for name, stage in stages.items()}


def test_dvc_yaml_params_are_the_table():
    dvc = _dvc_params()
    assert sorted(dvc) == sorted(STAGE_INPUTS), "every dvc.yaml stage has one entry in STAGE_INPUTS"
    for name, inputs in STAGE_INPUTS.items():
        assert len(set(dvc[name])) == len(dvc[name]), f"{name}: a params key is listed twice in dvc.yaml"
        assert set(dvc[name]) == set(inputs.params), (
            f"dvc.yaml stage {name} params {sorted(dvc[name])} differ from STAGE_INPUTS {sorted(inputs.params)}")


def test_every_not_shaping_key_is_a_declared_input_or_under_one():
    for name, inputs in STAGE_INPUTS.items():
        for key in inputs.not_shaping:
            assert key in inputs.params or any(key.startswith(p + ".") for p in inputs.params), (name, key)


def test_every_declared_key_exists_in_the_params():
    """Every key is a field of the params model (the dump leaves some out at their defaults)."""
    for inputs in STAGE_INPUTS.values():
        for key in (*inputs.params, *inputs.not_shaping):
            value: Any = Params()
            for part in key.split("."):
                fields = type(value).model_fields if isinstance(value, BaseModel) else value
                assert part in fields, f"{key} is not a params key"
                value = getattr(value, part) if isinstance(value, BaseModel) else value[part]


def test_the_three_cell_stages_share_one_digest():
    """`run_cell_stage` digests with the `cell` entry: cell_p and controls declare the same shaping keys."""
    cell = STAGE_INPUTS["cell"].shaping_keys()
    assert STAGE_INPUTS["cell_p"].shaping_keys() == cell
    assert STAGE_INPUTS["controls"].shaping_keys() == tuple(k for k in cell if k != METHOD_PARAMS)
    assert set(cell) == (set(DESIGN_SECTIONS) - {"corpus"}) | {METHOD_PARAMS}


@pytest.fixture(scope="module")
def design() -> Params:
    return load_design(ROOT / "params.yaml")


def _digest(params: Params, spec: CellSpec) -> str:
    return _inputs_fingerprint(params, spec, "corpus-fp", {"adapter": None})["digest"]


def _changed(params: Params, key: str, value) -> Params:
    data = params.model_dump(mode="json")
    holder = data
    *parents, leaf = key.split(".")
    for part in parents:
        holder = holder[part]
    holder[leaf] = value
    return Params.model_validate(data)


def _with_options(design: Params) -> list[str]:
    return [m for m in design.methods if method_class(m).Config.model_fields]


@pytest.mark.parametrize("key, value", [
    ("probes.batch_size", 3), ("execution.cell_workers", 1), ("execution.probe_workers", 1),
    ("tracking.experiment", "another"), ("report.results", "docs/other.md"), ("p_recipes", ["lora", "merged"]),
    ("scoring.bootstrap_resamples", 17), ("unlearning.learning_rate", 0.5), ("injection.recall_batch_size", 3),
    ("seeds", [0, 1, 2]), ("methods", ["none"]),
])
def test_a_key_that_shapes_no_cell_keeps_every_finished_cell(design, key, value):
    changed = _changed(design, key, value)
    for method in ["none", *_with_options(design)]:
        for spec in (CellSpec("C", method, 0), CellSpec("R-text", method, 1)):
            assert _digest(changed, spec) == _digest(design, spec), (key, spec)


def test_a_method_s_own_params_rerun_its_cells_only(design):
    numeric = [(m, f) for m in _with_options(design) for f, v in design.method_params[m].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    eco, field = numeric[0]
    other = next(m for m in _with_options(design) if m != eco)
    changed = _changed(design, f"method_params.{eco}.{field}", design.method_params[eco][field] * 2 + 1)
    assert _digest(changed, CellSpec("C", eco, 0)) != _digest(design, CellSpec("C", eco, 0))
    assert _digest(changed, CellSpec("C", other, 0)) == _digest(design, CellSpec("C", other, 0))
    assert _digest(changed, CellSpec("C", "none", 0)) == _digest(design, CellSpec("C", "none", 0))


@pytest.mark.parametrize("key, value", [("queries.n_per_split", 7), ("agent.max_iters", 3), ("agent.max_new_tokens", 11),
                                        ("model.dtype", "bfloat16")])
def test_a_key_that_shapes_every_cell_reruns_every_cell(design, key, value):
    changed = _changed(design, key, value)
    for method in ["none", *_with_options(design)]:
        assert _digest(changed, CellSpec("C", method, 0)) != _digest(design, CellSpec("C", method, 0)), (key, method)


def test_a_seed_is_its_own_cell(design):
    assert _digest(design, CellSpec("C", "none", 0)) != _digest(design, CellSpec("C", "none", 1))


def test_probes_and_unlearn_digests_cut_what_does_not_shape(design):
    probes = shaping(design, "probes", method="none")
    assert "out_dir" not in probes["probes"] and "clean" not in probes["probes"]
    assert "batch_size" in probes["probes"]  # it does shape the raw rows' last bits
    unlearn = shaping(design, "unlearn", method="ga")
    assert "out_dir" not in unlearn["unlearning"] and "recall_batch_size" not in unlearn["injection"]
    assert METHOD_PARAMS not in shaping(design, "unlearn", method="none")


def test_one_file_hashing_rule_relative_paths(tmp_path):
    """Output hashes and manifests both key files by relative path: moving a file between
    sub-folders changes the folder's hash."""
    (tmp_path / "a" / "x").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x" / "w.bin").write_bytes(b"1")
    before = io.folder_hash(tmp_path)
    assert io.file_hashes(tmp_path) == {"a/x/w.bin": io.file_sha256(tmp_path / "a" / "x" / "w.bin")}
    (tmp_path / "a" / "x" / "w.bin").rename(tmp_path / "b" / "w.bin")
    assert io.folder_hash(tmp_path) != before
    assert io.write_hashes(tmp_path) == io.file_hashes(tmp_path, exclude=[io.HASHES_FILE])
