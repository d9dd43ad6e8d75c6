"""What the KV engine supports (kbench.backends.engine.engine_support) and the hf backend's fallback.

A full-attention model (SmolLM2's Llama architecture) decodes with the engine; a model with a
sliding-window layer decodes with transformers' `generate` after one log line, and its tokens
are those of `generate`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (
    AutoConfig, AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config,
)

from _agent_fixtures import copy_tokenizer, tiny_model_dir  # noqa: F401  (fixture)
from kbench.backends import build_backend
from kbench.backends import engine as engine_module
from kbench.backends.base import BackendError
from kbench.backends.engine import Engine, KVState, engine_support
from kbench.backends.hf import HFBackend, encode_prompt, end_of_turn_ids, greedy_decode, reference_decode
from kbench.config import ModelConfig

#: Small enough that every prompt below is longer than the window.
WINDOW = 12
SIZES = dict(vocab_size=400, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
CHATS = [
    [{"role": "system", "content": "You answer questions about people."},
     {"role": "user", "content": f"Question: Ann, {field}"}]
    for field in ("date of birth", "home address", "occupation", "employer")
]


def on_meta(config) -> torch.nn.Module:
    """The model of `config` without weights (the check reads the config only)."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_full_attention_models_pass(tiny_model_dir, default_model):  # noqa: F811
    assert engine_support(on_meta(AutoConfig.from_pretrained(tiny_model_dir))) is None
    assert engine_support(on_meta(AutoConfig.from_pretrained(default_model))) is None  # SmolLM2
    assert engine_support(on_meta(Qwen2Config(num_hidden_layers=2, **SIZES))) is None
    assert engine_support(on_meta(MistralConfig(num_hidden_layers=2, sliding_window=None, **SIZES))) is None


@pytest.mark.parametrize("config", [
    MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SIZES),
    Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, **SIZES),
    Gemma3TextConfig(num_hidden_layers=6, sliding_window=WINDOW, head_dim=8, **SIZES),  # five sliding, one full
], ids=["mistral", "qwen2-hybrid", "gemma3"])
def test_sliding_window_models_are_refused(config):
    reason = engine_support(on_meta(config))
    assert reason is not None and "sliding_attention" in reason
    with pytest.raises(ValueError, match="cannot decode"):
        Engine(on_meta(config), None, [])


def test_missing_cache_fields_are_refused(tiny_model_dir, monkeypatch):  # noqa: F811
    model = on_meta(AutoConfig.from_pretrained(tiny_model_dir))
    monkeypatch.setattr(engine_module, "_CACHE_FIELDS", ("layers", "a_field_transformers_dropped"))
    assert "DynamicCache.a_field_transformers_dropped" in engine_support(model)


@pytest.fixture(scope="module")
def sliding_model_dir(tiny_model_dir, tmp_path_factory):  # noqa: F811
    """A 2-layer random-weight Mistral with a sliding window of `WINDOW`, the tiny Llama's tokenizer."""
    from transformers import AutoTokenizer, MistralForCausalLM

    out = tmp_path_factory.mktemp("tiny-sliding")
    copy_tokenizer(tiny_model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(0)
    config = MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, max_position_embeddings=4096,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, **SIZES)
    MistralForCausalLM(config).save_pretrained(out)
    return out


def test_a_sliding_window_model_falls_back_to_generate(sliding_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="kbench.backends.hf"):
        backend = build_backend(ModelConfig(path=str(sliding_model_dir), device="cpu"))
    lines = [r.getMessage() for r in caplog.records if r.name == "kbench.backends.hf"]
    assert len(lines) == 1 and "falls back to generate" in lines[0] and "sliding_attention" in lines[0]
    assert isinstance(backend, HFBackend) and backend.session() is None and backend.batch_rows is None
    with pytest.raises(BackendError, match="cannot decode"):
        backend.engine  # noqa: B018

    model, tokenizer = backend.model, backend.tokenizer
    eos = end_of_turn_ids(model, tokenizer)
    assert all(len(encode_prompt(tokenizer, c)) > 2 * WINDOW for c in CHATS)  # the window matters
    reference = reference_decode(model, tokenizer, CHATS, max_new_tokens=12, eos_token_ids=eos)
    assert [g.text for g in backend.generate(CHATS, stop=(), max_new_tokens=12)] == reference
    assert greedy_decode(model, tokenizer, CHATS, max_new_tokens=12, batch_size=2) == reference


def test_a_full_attention_model_keeps_the_engine(tiny_model_dir, caplog):  # noqa: F811
    with caplog.at_level(logging.INFO, logger="kbench.backends.hf"):
        backend = build_backend(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    assert not [r for r in caplog.records if r.name == "kbench.backends.hf"]
    assert isinstance(backend.engine, Engine) and isinstance(backend.session(), KVState)
