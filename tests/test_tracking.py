from __future__ import annotations

import json

import mlflow
import pytest

from kbench import tracking
from kbench.cli.main import main
from kbench.config import Params


def _runs(params, kind):
    experiment_id = tracking.open_experiment(params)
    return mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`{tracking.TAG_KIND}` = '{kind}'",
        output_format="list",
    )


def test_a_local_store_in_a_dvc_temporary_workspace_is_warned_about(tmp_path, monkeypatch, caplog):
    workspace = tmp_path / ".dvc" / "tmp" / "exps" / "tmpabc123"
    workspace.mkdir(parents=True)
    monkeypatch.setenv("KBENCH_ROOT", str(workspace))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking.open_experiment(Params())
    assert "temporary workspace" in caplog.text and "MLFLOW_TRACKING_URI" in caplog.text
    caplog.clear()
    monkeypatch.setenv("KBENCH_ROOT", str(tmp_path))
    tracking.open_experiment(Params())
    assert "temporary workspace" not in caplog.text


def test_run_round_trip(kbench_root):
    params = Params()
    assert tracking.tracking_uri(params) == f"sqlite:///{kbench_root / 'mlflow.db'}"
    with tracking.start_run(params, "cell", "C/none/0", tags={"kbench.substrate": "C"}):
        mlflow.log_metric("or_all", 0.5)
    (run,) = _runs(params, "cell")
    assert run.data.tags["kbench.key"] == "C/none/0"
    assert run.data.tags["kbench.substrate"] == "C"
    assert run.data.tags[tracking.TAG_COMMIT]
    assert run.data.params["corpus.n_entities"] == "250"
    assert run.data.params["seeds"] == "[0]"
    assert run.data.metrics["or_all"] == 0.5
    assert run.info.artifact_uri.startswith((kbench_root / "mlruns").as_uri())


class _Stop(Exception):
    pass


def test_an_expected_stop_ends_a_nested_run_killed_and_leaves_the_parent_open(kbench_root):
    params = Params()
    with tracking.start_run(params, "study", "s") as parent:
        with pytest.raises(_Stop):
            with tracking.start_run(params, "trial", "t0", nested=True, stopped_by=(_Stop,)):
                raise _Stop
        assert mlflow.active_run().info.run_id == parent.info.run_id
        with pytest.raises(ValueError):
            with tracking.start_run(params, "trial", "t1", nested=True, stopped_by=(_Stop,)):
                raise ValueError
    statuses = {run.data.tags["kbench.key"]: run.info.status for run in _runs(params, "trial")}
    assert statuses == {"t0": "KILLED", "t1": "FAILED"}
    (study,) = _runs(params, "study")
    assert study.info.status == "FINISHED"


def test_env_points_tracking_elsewhere(kbench_root, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri(Params()) == "http://127.0.0.1:5999"


def test_stage_outputs_are_rebuilt_in_a_fresh_store(kbench_root, monkeypatch):
    params = Params()
    (kbench_root / "params.yaml").write_text("{}\n")
    assert main(["corpus", "--out", "artifacts/corpus"]) == 0
    (first,) = _runs(params, "corpus")
    # Logging the same output again reuses its run.
    assert tracking.sync_outputs(params, [kbench_root / "artifacts"]) == [first.info.run_id]
    # A fresh clone has no mlflow.db (here: an empty store elsewhere); sync rebuilds the run
    # from the DVC-tracked output.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{kbench_root / 'fresh.db'}")
    assert main(["sync"]) == 0
    (rebuilt,) = _runs(params, "corpus")
    assert rebuilt.info.run_id != first.info.run_id
    assert rebuilt.data.tags["kbench.key"] == first.data.tags["kbench.key"]
    assert rebuilt.data.metrics["n_entities"] == 250
    manifest = json.loads((kbench_root / "artifacts/corpus/run.json").read_text())
    assert manifest["kind"] == "corpus"


def test_an_output_of_another_base_model_is_synced_without_these_params(kbench_root):
    """A folder the other model's params wrote (the Gemma presets' artifacts/gemma3-270m/) keeps
    its own tags when synced, and is not labelled with params it was not made under."""
    params = Params()
    for name, model in (("own", params.base_model), ("other", "gemma3-270m")):
        folder = kbench_root / "artifacts" / name
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text("{}")
        tracking.write_manifest(folder, "fit", f"{model}/eco", {tracking.TAG_BASE_MODEL: model}, {}, None, None)
    tracking.sync_outputs(params, [kbench_root / "artifacts"])
    runs = {run.data.tags[tracking.TAG_BASE_MODEL]: run for run in _runs(params, "fit")}
    assert runs[params.base_model].data.params["corpus.n_entities"] == "250"
    assert runs["gemma3-270m"].data.params == {}
    assert runs["gemma3-270m"].data.tags["kbench.key"] == "gemma3-270m/eco"
