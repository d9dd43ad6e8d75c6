"""Each architecture docs/models.md lists, on a tiny random config: the agent decodes it on the KV
engine as `generate` does (sliding windows included), the LoRA trainer's
packed passes see exactly what each example sees alone (sliding windows included), and the
activation methods find its decoder layers. Gemma 3 is the second packaged family."""

from __future__ import annotations


import pytest
import torch
from transformers import (
    AutoConfig, AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config,
)

from _agent_fixtures import copy_tokenizer, tiny_model_dir  # noqa: F401  (fixture)
from conftest import REPO
from kbench.backends import build_backend
from kbench.backends.engine import engine_support
from kbench.backends.hf import end_of_turn_ids, reference_decode
from kbench.backends.packaged import GEMMA_CHAT_TEMPLATE, PACKAGED_MODELS, is_model_folder
from kbench.config import LoraConfig, ModelConfig
from kbench.methods.residual import decoder_layers, residual_edit
from kbench.parametric.lora import (
    IGNORE, LoraError, attention_kinds, label_position_loss, micro_batch_backward, tokenize_chat, train_lora,
)

#: Shorter than every example below, so a sliding window cuts what a token sees.
WINDOW = 8
SIZES = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096)
#: name -> (config class, its arguments, the layer kinds it lays out, whether the engine decodes it)
ARCHITECTURES = {
    "llama": (LlamaConfig, dict(num_hidden_layers=2), ["full_attention"], True),
    "gemma3": (Gemma3TextConfig, dict(num_hidden_layers=6, sliding_window=WINDOW, head_dim=8),
               ["full_attention", "sliding_attention"], True),
    "mistral": (MistralConfig, dict(num_hidden_layers=2, sliding_window=WINDOW), ["sliding_attention"], True),
    "qwen2-hybrid": (Qwen2Config, dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                       max_window_layers=1), ["full_attention", "sliding_attention"], True),
}
SYSTEM = {"role": "system", "content": "You look people up in the registry and answer with the code only."}
CHATS = [[SYSTEM, {"role": "user", "content": f"What is the code of person {i}?"},
          {"role": "assistant", "content": f"The code of person {i} is {1000 + 7 * i}."}] for i in range(4)]


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch_dir(request, tiny_model_dir, tmp_path_factory):  # noqa: F811
    """A random-weight model of the architecture with the tiny Llama's tokenizer (Gemma's own
    chat template for gemma3, as `kbench setup` gives the packaged model)."""
    name = request.param
    config_class, arguments, _, _ = ARCHITECTURES[name]
    out = tmp_path_factory.mktemp(f"tiny-{name}")
    copy_tokenizer(tiny_model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    if name == "gemma3":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
        tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = config_class(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                          **arguments, **SIZES)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return name, out


def _model(folder, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def test_the_layer_kinds_and_the_engine_verdict_are_the_documented_ones(arch_dir):
    name, folder = arch_dir
    _, _, kinds, engine = ARCHITECTURES[name]
    model = _model(folder)
    assert attention_kinds(model) == kinds
    assert (engine_support(model) is None) == engine


def test_the_agent_decodes_as_generate_does(arch_dir):
    _, folder = arch_dir
    backend = build_backend(ModelConfig(path=str(folder), device="cpu"))
    assert backend.session() is not None  # the KV engine decodes it
    chats = [chat[:2] for chat in CHATS]
    eos = end_of_turn_ids(backend.model, backend.tokenizer)
    reference = reference_decode(backend.model, backend.tokenizer, chats, max_new_tokens=10, eos_token_ids=eos)
    assert [g.text for g in backend.generate(chats, stop=(), max_new_tokens=10)] == reference


def _alone(model, examples) -> torch.Tensor:
    """Each example in its own causal pass (the model's own masks, windows included)."""
    total = 0
    for e in examples:
        logits = model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, torch.tensor(e.labels[1:]), ignore_index=IGNORE,
                                                          reduction="sum")
    return total


def test_a_packed_pass_gives_the_loss_and_gradients_of_each_example_alone(arch_dir):
    _, folder = arch_dir
    model = _model(folder, torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    examples = [tokenize_chat(tokenizer, chat, 256) for chat in CHATS]
    assert all(len(e.input_ids) > 3 * WINDOW for e in examples)  # the window matters
    learned = tokenizer.decode([t for t in examples[0].labels if t != IGNORE])
    assert learned == "The code of person 0 is 1000." + ("<end_of_turn>" if arch_dir[0] == "gemma3" else "<|im_end|>")
    packed, count = label_position_loss(model, examples)
    packed_grads = torch.autograd.grad(packed, list(model.parameters()), allow_unused=True)
    reference = _alone(model, examples)
    reference_grads = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert count == sum(sum(label != IGNORE for label in e.labels[1:]) for e in examples)
    assert abs(packed.item() - reference.item()) < 1e-9 * max(1.0, abs(reference.item()))
    pairs = [(a, b) for a, b in zip(packed_grads, reference_grads) if b is not None]
    scale = max(b.abs().max().item() for _, b in pairs)
    assert max((a - b).abs().max().item() for a, b in pairs) < 1e-6 * scale


def test_lora_trains_and_activation_methods_find_the_decoder_layers(arch_dir):
    name, folder = arch_dir
    tokenizer = AutoTokenizer.from_pretrained(folder)
    examples = [tokenize_chat(tokenizer, chat, 256) for chat in CHATS]
    settings = LoraConfig(rank=4, alpha=8, learning_rate=1e-2, batch_size=4, micro_batch_size=4, epochs=3, seed=0)
    run = train_lora(_model(folder), examples, settings)
    assert len(run.epoch_losses) == 3 and run.epoch_losses[-1] < run.epoch_losses[0]
    model = run.model
    layers = decoder_layers(model)
    assert len(layers) == ARCHITECTURES[name][1]["num_hidden_layers"]
    ids = torch.tensor([examples[0].input_ids])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with residual_edit(model, len(layers) - 1, lambda h: h + 1.0):
            edited = model(input_ids=ids).logits
    assert not torch.allclose(plain, edited)
    if ARCHITECTURES[name][2] != ["full_attention"]:
        with pytest.raises(LoraError, match="use packing: trie"):
            micro_batch_backward(model, examples, settings.model_copy(update={"packing": "stem"}), 1)


def test_make_setup_converts_the_packaged_gemma_with_its_turn_format():
    folder = REPO / PACKAGED_MODELS["gemma3-270m"].folder
    if not is_model_folder(folder):
        pytest.fail(f"{folder} is missing: run `make setup` (kbench setup --model gemma3-270m) first")
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.sliding_window, config.num_hidden_layers) == ("gemma3_text", 512, 18)
    assert config.layer_types.count("full_attention") == 3  # one full layer in every six
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rendered = tokenizer.apply_chat_template(CHATS[0][:2], tokenize=False, add_generation_prompt=True)
    assert rendered == (f"<bos><start_of_turn>user\n{SYSTEM['content']}\n\n{CHATS[0][1]['content']}<end_of_turn>\n"
                        "<start_of_turn>model\n")
