"""What the KV engine supports (kbench.backends.engine.engine_support) and the hf backend's fallback.

A full-attention model (SmolLM2's Llama architecture) and a sliding-window one (Gemma 3, Mistral,
hybrid Qwen2) decode with the engine, a sliding window exactly as each row alone; a model with a
chunked or linear-attention layer decodes with transformers' `generate` after one log line, and its
tokens are those of `generate`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (
    AutoConfig, AutoModelForCausalLM, Gemma3TextConfig, Llama4TextConfig, MistralConfig, Qwen2Config, Qwen3NextConfig,
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


#: Models with a sliding window shorter than every prompt below, and with full layers beside it.
SLIDING = {
    "mistral": MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SIZES),
    "qwen2-hybrid": Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                max_window_layers=1, **SIZES),
    "gemma3": Gemma3TextConfig(num_hidden_layers=6, sliding_window=WINDOW, head_dim=8, **SIZES),  # five sliding, one full
}
#: A chunked-attention model (Llama 4's text model), whose chunk borders would move with left padding.
CHUNKED = Llama4TextConfig(num_hidden_layers=2, attention_chunk_size=WINDOW, num_local_experts=1, head_dim=8,
                           intermediate_size_mlp=64, **SIZES)


@pytest.mark.parametrize("name", list(SLIDING))
def test_sliding_window_models_pass(name):
    assert engine_support(on_meta(SLIDING[name])) is None


@pytest.mark.parametrize("config, kind", [
    (CHUNKED, "chunked_attention"),
    (Qwen3NextConfig(num_hidden_layers=4, head_dim=8, **SIZES), "linear_attention"),
], ids=["llama4-chunked", "qwen3-next-linear"])
def test_chunked_and_linear_attention_models_are_refused(config, kind):
    reason = engine_support(on_meta(config))
    assert reason is not None and kind in reason
    with pytest.raises(ValueError, match="cannot decode"):
        Engine(on_meta(config), None, [])


@pytest.mark.parametrize("name", list(SLIDING))
def test_a_sliding_window_decodes_on_the_engine_as_each_row_alone(name):
    """Rows of different lengths (left padding), prompts three windows long and a second turn over
    the kept state: every greedy token is the argmax of a full recompute of the row alone, and
    every scored log-probability equals it (float64 model, float32 logits)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(SLIDING[name]).double().eval()
    engine = Engine(model, type("Tok", (), {"pad_token_id": 0})(), [])
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 400, (n,), generator=generator).tolist() for n in (3 * WINDOW, 7, 4 * WINDOW, 3)]

    def alone(ids):
        with torch.inference_mode():
            return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)

    states = [KVState() for _ in prompts]
    for turn in range(2):
        outputs = engine.generate(states, prompts, max_new_tokens=WINDOW, share_prefixes=turn == 0)
        for prompt, output in zip(prompts, outputs):
            assert len(output) == WINDOW
            logits = alone(prompt + output)
            assert [int(logits[len(prompt) - 1 + i].argmax()) for i in range(len(output))] == output
        prompts = [p + o + [5, 6, 7] for p, o in zip(prompts, outputs)]  # the next turn extends each row
    continuations = [p[-5:] for p in prompts]
    scores = engine.score(prompts, continuations)
    for prompt, continuation, score in zip(prompts, continuations, scores):
        logits = alone(prompt + continuation)
        reference = [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(continuation)]
        assert score == pytest.approx(reference, abs=1e-9)


def test_missing_cache_fields_are_refused(tiny_model_dir, monkeypatch):  # noqa: F811
    model = on_meta(AutoConfig.from_pretrained(tiny_model_dir))
    monkeypatch.setattr(engine_module, "_CACHE_FIELDS", ("layers", "a_field_transformers_dropped"))
    assert "DynamicCache.a_field_transformers_dropped" in engine_support(model)


@pytest.fixture(scope="module")
def chunked_model_dir(tiny_model_dir, tmp_path_factory):  # noqa: F811
    """A 2-layer random-weight Llama 4 text model with attention chunks of `WINDOW`, the tiny Llama's tokenizer."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny-chunked")
    copy_tokenizer(tiny_model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(0)
    config = Llama4TextConfig(**{**CHUNKED.to_dict(), "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
                                 "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id})
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def test_a_chunked_attention_model_falls_back_to_generate(chunked_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="kbench.backends.hf"):
        backend = build_backend(ModelConfig(path=str(chunked_model_dir), device="cpu"))
    lines = [r.getMessage() for r in caplog.records if r.name == "kbench.backends.hf"]
    assert len(lines) == 1 and "falls back to generate" in lines[0] and "chunked_attention" in lines[0]
    assert isinstance(backend, HFBackend) and backend.session() is None and backend.batch_rows is None
    with pytest.raises(BackendError, match="cannot decode"):
        backend.engine  # noqa: B018

    model, tokenizer = backend.model, backend.tokenizer
    eos = end_of_turn_ids(model, tokenizer)
    assert all(len(encode_prompt(tokenizer, c)) > 2 * WINDOW for c in CHATS)  # the chunks matter
    reference = reference_decode(model, tokenizer, CHATS, max_new_tokens=12, eos_token_ids=eos)
    assert [g.text for g in backend.generate(CHATS, stop=(), max_new_tokens=12)] == reference
    assert greedy_decode(model, tokenizer, CHATS, max_new_tokens=12, batch_size=2) == reference


def test_a_full_attention_model_keeps_the_engine(tiny_model_dir, caplog):  # noqa: F811
    with caplog.at_level(logging.INFO, logger="kbench.backends.hf"):
        backend = build_backend(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    assert not [r for r in caplog.records if r.name == "kbench.backends.hf"]
    assert isinstance(backend.engine, Engine) and isinstance(backend.session(), KVState)
