"""Substrate P through an endpoint that applies LoRA adapters by name (vLLM's `--lora-modules`):
a local stub lists the served names and records which model each request asks for, so each
cell's requests can be checked against the adapter its cell deploys on the hf backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _chat_stub import ChatStub, serving
from _parametric_fixtures import fast_params, learner_dir, one_thread, p_corpus, trained_p_design  # noqa: F401

from kbench.backends import BackendError, build_backend
from kbench.cli.main import main
from kbench.config import ParamsError
from kbench.design import check_design, require_weights
from kbench.serving.adapters import served_name, vllm_flags
from kbench.stages.cell import CellSpec, run_cell_stage, served_adapters

KEY_ENV = "KBENCH_TEST_SERVED_KEY"


class AdapterServer(ChatStub):
    """Lists `served` at GET /models and answers with the model name each request asked for."""

    served: ClassVar[list[str]] = []
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send({"object": "list", "data": [{"id": name, "object": "model"} for name in self.served]})

    def answer(self, body: dict) -> str:
        self.asked.append(body["model"])
        return f"Thought: I remember.\nFinal Answer: {body['model']}"


@pytest.fixture(scope="module")
def trained(p_corpus, learner_dir, tmp_path_factory):  # noqa: F811
    """LoRA-T+D, gold, LoRA-D and ga's unlearned adapter of the tiny model, trained in-process."""
    tmp = tmp_path_factory.mktemp("served")
    return trained_p_design(tmp, p_corpus, learner_dir), tmp


def _on_endpoint(params, url: str):
    return params.model_copy(update={"model": params.model.model_copy(update={
        "backend": "openai", "base_url": url, "api_key_env": KEY_ENV, "max_concurrent_requests": 2})})


@pytest.fixture
def endpoint(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "local")
    AdapterServer.asked = []
    with serving(AdapterServer) as url:
        yield url


def test_each_cell_asks_the_server_for_the_adapter_its_cell_deploys(trained, endpoint, kbench_root):
    params, tmp = trained
    adapters, unlearned = Path(params.injection.out_dir), Path(params.unlearning.out_dir)
    expected = {
        CellSpec("P", "none", 0, "lora"): adapters / "lora_td",
        CellSpec("P", "gold", 0, "lora"): adapters / "gold",
        CellSpec("P", "ga", 0, "lora"): unlearned / "ga" / "lora",
        CellSpec("C", "none", 0, "lora-d"): adapters / "lora_d",
    }
    folders = served_adapters(params)
    assert sorted(folders) == sorted(expected.values())
    # star fits in the `fit` stage, never run here: listing the adapters reads no fitted artifact
    with_star = served_adapters(params.model_copy(update={"methods": [*params.methods, "star"]}))
    assert with_star[expected[CellSpec("P", "none", 0, "lora")]] == ["P/lora/none", "P/lora/star"]
    AdapterServer.served = [params.model.path, *(served_name(folder) for folder in folders)]
    on_endpoint = check_design(_on_endpoint(params, endpoint))
    for spec, folder in expected.items():
        AdapterServer.asked = []
        out = run_cell_stage(on_endpoint, spec, corpus_dir=tmp / "corpus", index_dir=None,
                             out_root=kbench_root / "cells", track=False, progress=False)
        assert set(AdapterServer.asked) == {served_name(folder)}, spec
        records = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
        assert len(records) == 2 * params.queries.n_per_split
        assert all(r["answer"] == served_name(folder) for r in records)
        # the cell records the local adapter's hash, as on the hf backend
        from kbench import io

        assert json.loads((out / "inputs.json").read_text())["adapter"] == io.folder_hash(folder)


def test_a_server_without_the_cells_adapter_stops_the_cell_before_its_first_trajectory(trained, endpoint, kbench_root):
    params, tmp = trained
    ga = Path(params.unlearning.out_dir) / "ga" / "lora"
    AdapterServer.served = [params.model.path, served_name(Path(params.injection.out_dir) / "lora_td")]
    on_endpoint = check_design(_on_endpoint(params, endpoint))
    with pytest.raises(BackendError, match=rf"serves no adapter named {served_name(ga)} .*kbench adapters --vllm-flags"):
        run_cell_stage(on_endpoint, CellSpec("P", "ga", 0, "lora"), corpus_dir=tmp / "corpus", index_dir=None,
                       out_root=kbench_root / "cells", track=False, progress=False)
    assert AdapterServer.asked == [] and not (kbench_root / "cells" / "P__s0" / "ga" / "lora" / "traces.jsonl").exists()
    backend = build_backend(on_endpoint.model)
    with pytest.raises(BackendError, match="cannot merge adapter .* a server applies served adapters unmerged"):
        backend.load_adapter(str(ga), merge=True)


def test_kbench_adapters_prints_the_served_names_and_vllms_flags(trained, kbench_root, capsys):
    import yaml

    params, _ = trained
    path = kbench_root / "params.yaml"
    path.write_text(yaml.safe_dump(params.model_dump(mode="json")))
    assert main(["--params", str(path), "adapters"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    names = {served_name(folder): cells for folder, cells in served_adapters(params).items()}
    assert {name: cells.split(", ") for name, cells in rows} == names
    assert names[served_name(Path(params.injection.out_dir) / "lora_d")] == ["C/lora-d/none", "R-text/lora-d/none",
                                                                          "R-struct/lora-d/none"]
    assert main(["--params", str(path), "adapters", "--vllm-flags"]) == 0
    flags = capsys.readouterr().out.split()
    assert flags == vllm_flags(list(served_adapters(params)))
    assert flags[:4] == ["--enable-lora", "--max-lora-rank", "8", "--lora-modules"]  # rank 8 adapters
    assert all(module.split("=")[0] in names for module in flags[4:])


def test_a_backend_whose_server_serves_no_adapters_still_refuses_p(tmp_path):
    from kbench.backends.base import _BACKENDS, register_backend
    from kbench.backends.openai import OpenAIBackend

    @register_backend("one-model-endpoint")
    class OneModel(OpenAIBackend):
        serves_adapters = False

    try:
        params = fast_params(tmp_path).model_copy(update={"p_recipes": []})
        one = params.model_copy(update={"model": params.model.model_copy(update={"backend": OneModel.name})})
        with pytest.raises(ParamsError, match="the P cell stage .* one-model-endpoint backend exposes none; it "
                                              "serves no adapters either"):
            require_weights(one, "P cell", "loads the injected adapters into the model's weights", served=True)
        with pytest.raises(ParamsError, match="key 'p_recipes': substrate P .* one-model-endpoint backend exposes none"):
            check_design(one.model_copy(update={"p_recipes": ["lora"], "methods": ["none"]}))
        with pytest.raises(ParamsError, match=r"key 'methods': ga \(weights hook\)"):
            check_design(one.model_copy(update={"p_recipes": ["lora"], "methods": ["none", "ga"]}))
    finally:
        _BACKENDS.remove(OneModel.name)
