"""The MLflow tracking server for real: `kbench.tracking.tracking_server` on a free local port,
a cell and the comparison logged to it through MLFLOW_TRACKING_URI (runs in its SQL store,
artifacts uploaded through it), then the server stopped: a stage pointed at it stops in one
line before any work."""

from __future__ import annotations

import json
import socket
import urllib.parse

import mlflow
import pytest

from kbench import tracking
from kbench.cli.main import main
from kbench.servers import free_port

from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from test_endpoint_preset import _preset, _write


@pytest.mark.slow
def test_a_cell_and_the_comparison_log_to_a_tracking_server(tiny_model_dir, kbench_root, capsys, monkeypatch):  # noqa: F811
    params = _write(kbench_root, _preset(**{
        "model.backend": "hf", "model.path": str(tiny_model_dir), "model.base_url": None,
        "methods": ["none"], "substrates": ["C"], "queries.n_per_split": 1, "queries.forms": [], "agent.max_iters": 1,
        "agent.max_new_tokens": 8, "agent.summary_max_new_tokens": 8, "tracking.experiment": "served",
    }))
    with tracking.tracking_server(kbench_root, free_port()) as uri:
        assert urllib.parse.urlsplit(uri).hostname == "127.0.0.1"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        for stage in (["corpus"], ["index"], ["cell", "--substrate", "C", "--seed", "0", "--method", "none",
                                               "--no-progress"], ["compare"]):
            assert main(["--params", params, *stage]) == 0, stage
        mlflow.set_tracking_uri(uri)
        experiment = mlflow.get_experiment_by_name("served")
        runs = mlflow.search_runs([experiment.experiment_id], output_format="list")
        kinds = {r.data.tags[tracking.TAG_KIND] for r in runs}
        assert {tracking.KIND_CORPUS, tracking.KIND_CELL, tracking.KIND_COMPARE} <= kinds
        compare_run = next(r for r in runs if r.data.tags[tracking.TAG_KIND] == tracking.KIND_COMPARE)
        assert compare_run.data.metrics["cell_runs"] == 1.0
        cell_run = next(r for r in runs if r.data.tags[tracking.TAG_KIND] == tracking.KIND_CELL)
        # Artifacts went through the server into its own artifact root, not the local mlruns/.
        traces = mlflow.artifacts.download_artifacts(run_id=cell_run.info.run_id, artifact_path="output/traces.jsonl",
                                                     dst_path=str(kbench_root / "fetched"))
        assert len(open(traces).read().splitlines()) == 2
        assert list((kbench_root / tracking.SERVER_ARTIFACTS).rglob("traces.jsonl"))
        assert (kbench_root / tracking.SERVER_STORE).is_file() and not (kbench_root / "mlflow.db").exists()
        assert json.loads((kbench_root / "reports" / "comparison.json").read_text())["rows"]
    capsys.readouterr()
    assert main(["--params", params, "compare"]) == 2  # the server is gone
    err = capsys.readouterr().err.strip()
    assert f"the MLflow tracking server at {uri} does not answer" in err and "\n" not in err


def test_a_server_that_cannot_start_is_one_line(tmp_path):
    with socket.socket() as taken:  # the port is someone else's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(tracking.TrackingError, match="the MLflow tracking server exited at start"):
            with tracking.tracking_server(tmp_path, port):
                pass
