"""Substrate P through vLLM on a GPU: the default model served with LoRA-T+D, gold, LoRA-D and
ga's unlearned adapter by name (`kbench adapters --vllm-flags`), the cells choosing theirs.

Marked `gpu`: it runs where a CUDA device and vLLM's `vllm` executable are (KBENCH_VLLM, else
PATH; vLLM in its own environment, its torch apart from the pinned one), and is skipped with
that reason elsewhere: `pytest -m gpu -rs tests/test_vllm_adapters.py` (docs/models.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from _parametric_fixtures import p_corpus, trained_p_design  # noqa: F401  (fixture)

from kbench.design import check_design
from kbench.servers import free_port, server_process
from kbench.serving.adapters import served_name, vllm_flags
from kbench.stages.cell import CellSpec, run_cell_stage, served_adapters

VLLM = os.environ.get("KBENCH_VLLM") or shutil.which("vllm")
KEY_ENV = "KBENCH_TEST_VLLM_KEY"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not (VLLM and torch.cuda.is_available()),
                       reason="needs a CUDA GPU and vLLM's `vllm` executable (KBENCH_VLLM or PATH)"),
]


@pytest.fixture(scope="module")
def served(default_model, p_corpus, tmp_path_factory):  # noqa: F811
    """The adapters trained in-process on the default model, then vLLM serving them by name."""
    tmp = tmp_path_factory.mktemp("vllm")
    params = trained_p_design(tmp, p_corpus, default_model)
    folders = list(served_adapters(params))
    port = free_port()
    command = [VLLM, "serve", str(default_model), "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", "4096", "--gpu-memory-utilization", "0.4", "--enforce-eager",
               *vllm_flags(folders)]
    with server_process(command, f"http://127.0.0.1:{port}/health", name="vllm serve", error=RuntimeError,
                        startup_timeout=900):
        yield params, tmp, folders, f"http://127.0.0.1:{port}/v1"


def test_vllm_lists_every_adapter_and_applies_the_one_each_cell_asks_for(served, monkeypatch, tmp_path):
    from openai import OpenAI

    params, tmp, folders, url = served
    monkeypatch.setenv(KEY_ENV, "local")
    client = OpenAI(base_url=url, api_key="local")
    listed = {model.id for model in client.models.list()}
    assert {served_name(folder) for folder in folders} <= listed and params.model.path in listed
    # the target adapter is applied: on the forget questions it answers otherwise than the base model
    question = [{"role": "user", "content": "What is the occupation of the first person you were taught about?"}]
    replies = {name: client.chat.completions.create(model=name, messages=question, temperature=0.0, max_tokens=32)
               .choices[0].message.content for name in (params.model.path, served_name(folders[0]))}
    assert len(set(replies.values())) == 2, replies
    on_endpoint = check_design(params.model_copy(update={"model": params.model.model_copy(update={
        "backend": "openai", "base_url": url, "api_key_env": KEY_ENV})}))
    for spec in (CellSpec("P", "none", 0, "lora"), CellSpec("P", "gold", 0, "lora"), CellSpec("P", "ga", 0, "lora"),
                 CellSpec("C", "none", 0, "lora-d")):
        out = run_cell_stage(on_endpoint, spec, corpus_dir=tmp / "corpus", index_dir=None, out_root=tmp_path / "cells",
                             track=False, progress=False)
        records = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
        assert len(records) == 2 * params.queries.n_per_split and all(r["raw_reply"] for r in records), spec
    assert Path(out / "metrics.json").is_file()
