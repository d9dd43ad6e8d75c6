"""Backends: the registry, the hf backend on a tiny random-weight model, adapters, openai set-up errors."""

import pytest

from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from kbench.backends import BackendError, backend_names, build_backend
from kbench.backends.base import truncate_at_stop
from kbench.config import ModelConfig

CONVERSATIONS = [
    [{"role": "system", "content": "You answer."}, {"role": "user", "content": "Question: What is it?"}],
    [{"role": "system", "content": "You answer questions about people and their occupation and employer."},
     {"role": "user", "content": "Question: What is the home address of a person called Ann?"}],
    [{"role": "user", "content": "Hi"}],
]


def test_registry():
    assert {"hf", "openai"} <= set(backend_names())
    with pytest.raises(BackendError, match="does not exist"):
        build_backend(ModelConfig(path="/nonexistent/model"))


def test_openai_backend_needs_a_url_and_a_key_from_the_environment(monkeypatch):
    monkeypatch.delenv("KBENCH_TEST_KEY", raising=False)
    with pytest.raises(BackendError, match="base_url"):
        build_backend(ModelConfig(backend="openai", path="m", api_key_env="KBENCH_TEST_KEY"))
    with pytest.raises(BackendError, match=r"\$KBENCH_TEST_KEY"):
        build_backend(ModelConfig(backend="openai", path="m", base_url="http://127.0.0.1:1/v1",
                                  api_key_env="KBENCH_TEST_KEY"))


def test_truncate_at_stop():
    assert truncate_at_stop("Action: a[b]\nObservation: made up", ["Observation:"]) == "Action: a[b]\n"
    assert truncate_at_stop("abc", []) == "abc"
    assert truncate_at_stop("x STOP1 y STOP2", ["STOP2", "STOP1"]) == "x "


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):  # noqa: F811
    return build_backend(ModelConfig(path=str(tiny_model_dir), device="cpu"))


def test_hf_batched_equals_one_at_a_time(tiny):
    batched = tiny.generate(CONVERSATIONS, stop=[], max_new_tokens=12)
    alone = [tiny.generate([c], stop=[], max_new_tokens=12)[0] for c in CONVERSATIONS]
    assert batched == alone
    assert any(g.text for g in batched)


def test_hf_stop_strings_cut_the_continuation(tiny):
    (full,) = tiny.generate(CONVERSATIONS[:1], stop=[], max_new_tokens=20)
    assert len(full.text) > 4
    marker = full.text[2:4]
    (stopped,) = tiny.generate(CONVERSATIONS[:1], stop=[marker], max_new_tokens=20)
    assert stopped.text == full.text[: full.text.find(marker)]


def test_hf_renders_the_chat_template(tiny):
    prompt = tiny.render(CONVERSATIONS[0])
    assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>system\nYou answer.<|im_end|>" in prompt
    assert tiny.model is not None and tiny.tokenizer.padding_side == "left"


def test_hf_loads_a_lora_adapter(tiny_model_dir, tmp_path):  # noqa: F811
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 2.0)
    peft_model.save_pretrained(tmp_path / "adapter")

    plain = build_backend(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    before = plain.generate(CONVERSATIONS, stop=[], max_new_tokens=8)
    plain.load_adapter(str(tmp_path / "adapter"))
    adapted = plain.generate(CONVERSATIONS, stop=[], max_new_tokens=8)
    assert adapted != before
    merged = build_backend(ModelConfig(path=str(tiny_model_dir), device="cpu"))
    merged.load_adapter(str(tmp_path / "adapter"), merge=True)
    assert merged.generate(CONVERSATIONS, stop=[], max_new_tokens=8) == adapted
    with pytest.raises(BackendError, match="LoRA adapter"):
        merged.load_adapter(str(tmp_path / "missing"))


def test_the_one_loader_honours_dtype_and_device(tiny_model_dir):  # noqa: F811
    import torch

    from kbench.backends.hf import load_model

    model, tokenizer = load_model(ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert not model.training and tokenizer.pad_token is not None
    with pytest.raises(BackendError, match="does not exist"):
        load_model(ModelConfig(path="/nonexistent/model"))


def test_the_one_greedy_decoder_batches_as_the_backend_does(tiny):
    from kbench.backends.hf import greedy_decode

    texts = [g.text for g in tiny.generate(CONVERSATIONS, stop=[], max_new_tokens=12)]
    assert greedy_decode(tiny.model, tiny.tokenizer, CONVERSATIONS, max_new_tokens=12) == texts
    # In smaller batches (the recall probes' batch_size) every row decodes the same.
    assert greedy_decode(tiny.model, tiny.tokenizer, CONVERSATIONS, max_new_tokens=12, batch_size=2) == texts
