"""The openai backend for real: `transformers serve` on 127.0.0.1 runs the default model."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from _agent_fixtures import params, small_corpus  # noqa: F401  (fixtures)
from kbench.config import ModelConfig
from kbench.servers import free_port, server_process
from kbench.methods import ALL_SUBSTRATES, Method, MethodError, register_method, unregister_method
from kbench.agent.runner import run_cell, setup_cell

pytestmark = pytest.mark.slow
KEY_ENV = "KBENCH_TEST_OPENAI_KEY"


@pytest.fixture(scope="module")
def server():
    from kbench.backends.packaged import ensure_default_model

    folder = str(ensure_default_model(Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"))
    cli = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([cli, "serve", folder, "--host", "127.0.0.1", "--port", str(port)], f"{url}/health",
                        name="transformers serve", error=RuntimeError, startup_timeout=180,
                        env={**os.environ, "HF_HUB_OFFLINE": "1"}):
        yield ModelConfig(backend="openai", path=folder, base_url=f"{url}/v1", api_key_env=KEY_ENV,
                          max_concurrent_requests=2)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-needed-locally")


def test_generates_a_batch_and_honours_stop_strings(server):
    from kbench.backends import build_backend

    backend = build_backend(server)
    conversations = [
        [{"role": "user", "content": "Say hello."}],
        [{"role": "user", "content": "Write the word Observation: then the number 7."}],
    ]
    replies = backend.generate(conversations, stop=["Observation:"], max_new_tokens=16)
    assert len(replies) == 2 and replies[0].text.strip()
    assert all("Observation:" not in r.text for r in replies)
    assert backend.has_weights is False


def test_runs_a_cell(server, small_corpus, params, tmp_path):  # noqa: F811
    small = params.model_copy(update={"agent": params.agent.model_copy(
        update={"max_new_tokens": 16, "summary_max_new_tokens": 16, "max_iters": 1})})
    agent = setup_cell(small, small_corpus, server, substrate="R-struct", method="none", seed=0)
    items = [(q, "forget") for q in small_corpus.sample_queries("forget", 2, 0)]
    records = run_cell(agent, items, tmp_path / "traces.jsonl", progress=False)
    assert len(records) == 2 and all(r.raw_reply and r.summary for r in records)
    assert all(r.halted_reason in {"final_answer", "parse_error", "max_iters"} for r in records)


def test_methods_that_need_weights_are_refused(server, small_corpus, params):  # noqa: F811
    @register_method("needs-weights", substrates=ALL_SUBSTRATES, hooks=frozenset({"forward"}))
    class NeedsWeights(Method):
        def forward_hooks(self, backend, queries):
            raise AssertionError("never reached")

    try:
        with pytest.raises(MethodError, match="openai backend has none"):
            setup_cell(params, small_corpus, server, substrate="R-struct", method="needs-weights", seed=0)
    finally:
        unregister_method("needs-weights")
