"""llama.cpp's server for real: a model with SmolLM2's tokenizer converted to GGUF by llama.cpp's
converter, served on 127.0.0.1, answering Mem0's JSON-object requests, running the `mem0` memory system on
one instance and stopped afterwards; a cell run through the `llama-cpp` backend, which starts its
own server; P cells through it, each adapter converted to a GGUF LoRA and applied by a server of
its own; a file that is no model and an endpoint that does not answer are one clear error each."""

from __future__ import annotations

import json
import socket
import urllib.parse
from datetime import date

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kbench.backends import llama_cpp as llama_cpp_backend
from kbench.backends.llama_cpp import LlamaCppBackend
from kbench.cli.main import main
from kbench.config import Params
from kbench.serving import ServingError, check_endpoint, llama_server, to_gguf
from kbench.stages.memory import endpoint_for

from _agent_fixtures import copy_tokenizer, small_corpus  # noqa: F401  (fixture)
from _parametric_fixtures import p_corpus, trained_p_design  # noqa: F401  (fixture)
from test_endpoint_preset import _preset, _write


@pytest.fixture(scope="module")
def tiny_smol(default_model, tmp_path_factory):
    """A 2-layer random-weight model with SmolLM2's tokenizer and chat template: Mem0's ~8.6k-token
    prompts take seconds instead of the half minute each takes on SmolLM2 (the cell test below
    serves the real model)."""
    folder = tmp_path_factory.mktemp("tiny-smol")
    copy_tokenizer(default_model, folder, "generation_config.json")
    config = AutoConfig.from_pretrained(default_model)
    config.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(tiny_smol, tmp_path_factory):
    """`tiny_smol` converted by llama.cpp's converter and served."""
    gguf = to_gguf(tiny_smol, tmp_path_factory.mktemp("gguf") / "model.gguf")
    with llama_server(gguf, alias="smol", threads=2, n_ctx=16384, trained_ctx=8192) as base_url:
        yield base_url
    port = urllib.parse.urlsplit(base_url).port
    with socket.socket() as probe:  # stopped: nothing listens there any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_the_server_answers_json_objects_on_loopback(served):
    from openai import OpenAI

    assert urllib.parse.urlsplit(served).hostname == "127.0.0.1"
    check_endpoint(served)
    reply = OpenAI(base_url=served, api_key="local").chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "List two colors as JSON."}], max_tokens=40,
        temperature=0.0, response_format={"type": "json_object"})
    text = reply.choices[0].message.content
    assert isinstance(json.loads(text) if reply.choices[0].finish_reason == "stop" else {}, dict)


@pytest.mark.slow
def test_mem0_runs_an_instance_through_the_server(served, tiny_smol, small_corpus):  # noqa: F811
    """The plumbing: Mem0's requests reach the server and come back (random weights: each extraction
    is counted as failed, not raised); the default run's memory lane runs mem0 on SmolLM2 itself.
    What Mem0 then holds, added and deleted, is tests/test_mem0_forget.py's (a scripted model)."""
    from kbench.backends import build_backend
    from kbench.config import ModelConfig
    from kbench.memory import make_instances
    from kbench.memory.systems import LlmEndpoint, memory_system_class, run_instance

    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    backend = build_backend(ModelConfig(path=str(tiny_smol)))  # answers the probes: any model will do
    endpoint = LlmEndpoint(served, "smol", 128)
    run = run_instance(lambda: memory_system_class("mem0")(backend, endpoint=endpoint), instance)
    assert len(run.items) == len(instance.probes) and {i.system for i in run.items} == {"mem0"}
    assert set(run.memories) == {"control", "forget"} and run.failures > 0
    # Mem0's prompt is dated by the session, not the wall clock: today's date appears in no memory
    assert date.today().isoformat() not in "\n".join(run.memories.values())


@pytest.mark.slow
def test_the_memory_stage_serves_the_agent_base_for_its_duration(tiny_smol):
    """With no endpoint of the user's or the run's, mem0's calls go to a llama.cpp server over the
    agent base under `memory.llm_model`'s name, stopped when the stage's systems are done."""
    from openai import OpenAI

    params = Params.model_validate({"model": {"path": str(tiny_smol)}, "agent_base": {"enabled": False},
                                    "memory": {"llm_model": "base", "llm_context": 16384}})
    with endpoint_for(params) as endpoint:
        assert (endpoint.model, urllib.parse.urlsplit(endpoint.base_url).hostname) == ("base", "127.0.0.1")
        assert [m.id for m in OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key).models.list()] == ["base"]
    with socket.socket() as probe:  # stopped with the stage's systems
        assert probe.connect_ex(("127.0.0.1", urllib.parse.urlsplit(endpoint.base_url).port)) != 0


def test_a_file_that_is_no_model_and_a_silent_endpoint_are_one_line_each(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServingError, match=r"cannot convert .* to GGUF: "):
        to_gguf(tmp_path, tmp_path / "x.gguf")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file")
    with pytest.raises(ServingError, match=r"llama.cpp's server exited at start"):
        with llama_server(bogus, alias="x", threads=1):
            pass
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ServingError, match=rf"the endpoint http://127.0.0.1:{port}/v1 does not answer"):
        check_endpoint(f"http://127.0.0.1:{port}/v1")


@pytest.mark.slow
def test_a_cell_runs_through_a_llama_cpp_server_the_backend_starts(default_model, kbench_root, capsys):
    """presets/endpoint.yaml on `model.backend: llama-cpp` over the default model's folder: the
    stages before the cells, one cell; a server gone mid-cell stops the stage in one line with the
    finished records kept, and the rerun resumes; the server is stopped afterwards."""
    params = _write(kbench_root, _preset(**{
        "model.backend": LlamaCppBackend.name, "model.path": str(default_model), "model.base_url": None,
        "queries.n_per_split": 1, "queries.forms": [], "agent.max_iters": 2, "agent.max_new_tokens": 24,
        "agent.summary_max_new_tokens": 16,
    }))
    cell_args = ["--params", params, "cell", "--substrate", "R-struct", "--seed", "0", "--method", "none",
                 "--no-track", "--no-progress"]
    try:
        assert main(["--params", params, "params"]) == 0
        for stage in (["corpus", "--no-track"], ["index"], ["agent-base", "--no-track"], ["fit", "--no-track"],
                      ["unlearn", "--no-track"]):
            assert main(["--params", params, *stage]) == 0, stage
        assert main(cell_args) == 0
        (base_url,) = llama_cpp_backend._servers.values()
        assert urllib.parse.urlsplit(base_url).hostname == "127.0.0.1"
        traces = kbench_root / "artifacts" / "cells" / "R-struct__s0" / "none" / "none" / "traces.jsonl"
        first, second = traces.read_text().splitlines()
        assert json.loads(first)["raw_reply"] and json.loads(second)["raw_reply"]

        traces.write_text(first + "\n")  # one trajectory left to run, and the server gone
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
        (key,) = llama_cpp_backend._servers
        llama_cpp_backend._servers[key] = dead
        capsys.readouterr()
        assert main(cell_args) == 2
        err = capsys.readouterr().err.strip()
        assert "cannot reach" in err and "\n" not in err and "Traceback" not in err
        assert traces.read_text() == first + "\n"  # the finished record is kept
        llama_cpp_backend._servers[key] = base_url  # the server back
        assert main(cell_args) == 0
        assert traces.read_text().splitlines() == [first, second]  # resumed: the same two records
    finally:
        llama_cpp_backend.stop_servers()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", urllib.parse.urlsplit(base_url).port)) != 0


@pytest.mark.slow
def test_p_cells_run_through_llama_cpp_with_their_adapters(tiny_smol, p_corpus, tmp_path_factory, kbench_root):  # noqa: F811
    """LoRA-T+D, gold and ga's adapter of `tiny_smol`, trained in-process: each P cell converts its
    adapter to a GGUF LoRA and asks a server of its own for it by its served name; the adapter
    changes what the model answers."""
    from kbench.backends import build_backend
    from kbench.design import check_design
    from kbench.serving import served_name
    from kbench.stages.cell import CellSpec, run_cell_stage

    tmp = tmp_path_factory.mktemp("p-llama")
    params = trained_p_design(tmp, p_corpus, tiny_smol)
    on_llama = check_design(params.model_copy(update={"model": params.model.model_copy(
        update={"backend": LlamaCppBackend.name})}))
    folders = {"none": tmp / "adapters" / "lora_td", "gold": tmp / "adapters" / "gold",
               "ga": tmp / "unlearned" / "ga" / "lora"}
    try:
        for method in folders:
            out = run_cell_stage(on_llama, CellSpec("P", method, 0, "lora"), corpus_dir=tmp / "corpus",
                                 index_dir=None, out_root=kbench_root / "cells", track=False, progress=False)
            records = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
            assert len(records) == 2 * params.queries.n_per_split and all(r["raw_reply"] for r in records)
        served = {key[3]: key[4] for key in llama_cpp_backend._servers}  # no base-model server: none asked
        assert served == {served_name(folder): str(folder.resolve()) for folder in folders.values()}
        base, target = build_backend(on_llama.model), build_backend(on_llama.model)
        base.start()  # the base model's server, started on demand (its first request would too)
        assert {key[3] for key in llama_cpp_backend._servers} - set(served) == {llama_cpp_backend.ALIAS}
        target.load_adapter(str(folders["none"]))
        questions = [[{"role": "user", "content": f"What is the {field} of {entity.name}?"}]
                     for entity in list(p_corpus.entities.values())[:4] for field in ("occupation", "email")]
        replies = [[g.text for g in backend.generate(questions, stop=[], max_new_tokens=12)]
                   for backend in (base, target)]
        assert replies[0] != replies[1]
    finally:
        llama_cpp_backend.stop_servers()


def test_the_llama_cpp_backend_refuses_what_it_cannot_serve(tmp_path):
    from kbench.backends import BackendError, build_backend
    from kbench.config import ModelConfig

    with pytest.raises(BackendError, match=r"neither a transformers model folder nor a \.gguf file"):
        build_backend(ModelConfig(backend=LlamaCppBackend.name, path=str(tmp_path)))
    with pytest.raises(BackendError, match=r"starts its own server: leave model.base_url unset"):
        build_backend(ModelConfig(backend=LlamaCppBackend.name, path=str(tmp_path), base_url="http://127.0.0.1:1/v1"))
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF but not really")
    with pytest.raises(BackendError, match=r"bogus.gguf is not a readable GGUF file"):
        build_backend(ModelConfig(backend=LlamaCppBackend.name, path=str(bogus)))
    assert not llama_cpp_backend._servers
