"""Secrets stay out of what a run writes (issue 14): the API key and URL credentials.

A cell runs on the openai backend against a local OpenAI-compatible stub whose URL carries
credentials, with the key in an environment variable; afterwards mlflow.db, the cell's
inputs.json, its other files and the log are scanned for both and hold neither.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest

from kbench.config import ParamsError, parse_params, redact_url
from kbench.corpus import write_corpus
from kbench.stages.cell import CellSpec, run_cell_stage

from _agent_fixtures import small_corpus  # noqa: F401  (fixture)
from _chat_stub import ChatStub, serving

KEY = "sk-planted-0123456789abcdef"
PASSWORD = "pl4nted-pa55word"


class _Stub(ChatStub):
    """Answers every chat completion with a final answer (or a summary when no stop is given)."""

    authorizations: list[str] = []

    def answer(self, body) -> str:
        _Stub.authorizations.append(self.headers.get("Authorization", ""))
        return "Final Answer: unknown" if body.get("stop") else "A summary."


@pytest.fixture
def endpoint():
    with serving(_Stub, f"kbench:{PASSWORD}") as url:
        yield url


def test_a_cell_run_writes_neither_the_key_nor_url_credentials(kbench_root, small_corpus, endpoint, monkeypatch,  # noqa: F811
                                                                caplog):
    monkeypatch.setenv("KBENCH_TEST_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    params = parse_params({
        "model": {"backend": "openai", "path": "stub-model", "base_url": endpoint, "api_key_env": "KBENCH_TEST_KEY"},
        "agent_base": {"enabled": False},
        "queries": {"n_per_split": 2, "forms": []},
    })
    write_corpus(small_corpus, kbench_root / "corpus")
    out = run_cell_stage(params, CellSpec("R-struct", "none", 0), corpus_dir=kbench_root / "corpus",
                         index_dir=None, out_root=kbench_root / "cells")
    assert len((out / "traces.jsonl").read_text().splitlines()) == 4  # the run really went through the stub
    expected = "Basic " + base64.b64encode(f"kbench:{PASSWORD}".encode()).decode()
    assert set(_Stub.authorizations) == {expected}  # the credentials still reach the server
    written = [p for p in kbench_root.rglob("*") if p.is_file()]
    assert kbench_root / "mlflow.db" in written and out / "inputs.json" in written
    for path in written:
        data = path.read_bytes()
        assert KEY.encode() not in data and PASSWORD.encode() not in data, path
    assert KEY not in caplog.text and PASSWORD not in caplog.text
    assert json.loads((out / "inputs.json").read_text())["model"]["base_url"].startswith("http://***@127.0.0.1:")


def test_a_key_pasted_as_the_variable_name_is_refused_without_being_echoed():
    with pytest.raises(ParamsError) as error:
        parse_params({"model": {"api_key_env": KEY}})
    assert "model.api_key_env" in str(error.value) and KEY not in str(error.value)
    assert redact_url("https://u:p@host:1/v1") == "https://***@host:1/v1"
    assert redact_url("http://host/v1") == "http://host/v1"
