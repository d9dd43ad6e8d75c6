"""The generic LoRA routine: label-position loss, micro-batching, seeding, step/epoch budgets."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _parametric_fixtures import learner_dir, one_thread  # noqa: F401  (fixtures)

import kbench.parametric.lora
from kbench.config import LoraConfig
from kbench.parametric.lora import (
    IGNORE, Example, LoraError, label_position_loss, micro_batch_backward, micro_batches, pack, stem_length,
    tokenize_chat, total_steps, train_lora,
)


def _model(tiny_model_dir, device="cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(device)


def _tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _chats() -> list[list[dict]]:
    return [
        [{"role": "user", "content": f"What is the code of person {i}?"},
         {"role": "assistant", "content": f"The code of person {i} is {1000 + 7 * i}."}]
        for i in range(6)
    ]


def _examples(tiny_model_dir) -> list[Example]:
    tokenizer = _tokenizer(tiny_model_dir)
    return [tokenize_chat(tokenizer, chat, 256) for chat in _chats()]


def _settings(**overrides) -> LoraConfig:
    values = dict(rank=4, alpha=8, learning_rate=1e-2, batch_size=4, seed=3, epochs=2, micro_batch_size=2)
    return LoraConfig(**{**values, **overrides})


def test_tokenize_chat_learns_assistant_turns_only(tiny_model_dir):
    tokenizer = _tokenizer(tiny_model_dir)
    example = tokenize_chat(tokenizer, _chats()[0], 256)
    learned = tokenizer.decode([t for t in example.labels if t != IGNORE])
    assert learned == "The code of person 0 is 1000.<|im_end|>"
    assert example.labels[0] == IGNORE


def _one_row_per_example_loss(model, examples) -> torch.Tensor:
    """The reference: each example alone, full logits, summed cross-entropy of its labels."""
    total = 0
    for e in examples:
        logits = model(input_ids=torch.tensor([e.input_ids], device=model.device)).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(
            logits, torch.tensor(e.labels[1:], device=model.device), ignore_index=IGNORE, reduction="sum")
    return total


def test_packed_loss_and_gradients_equal_each_example_alone(tiny_model_dir, device):
    model = _model(tiny_model_dir, device).to(torch.float64)
    examples = _examples(tiny_model_dir)[:3]
    examples = [*examples, examples[1]]  # a duplicate shares every node of its twin
    loss_sum, count = label_position_loss(model, examples)
    packed_grads = torch.autograd.grad(loss_sum, list(model.parameters()))
    reference = _one_row_per_example_loss(model, examples)
    reference_grads = torch.autograd.grad(reference, list(model.parameters()))
    assert count == sum(sum(label != IGNORE for label in e.labels[1:]) for e in examples)
    assert abs(loss_sum.item() - reference.item()) < 1e-9
    # Llama's RMSNorm computes in float32 whatever the dtype, so gradients agree to float32 rounding.
    scale = max(g.abs().max().item() for g in reference_grads)
    assert max((a - b).abs().max().item() for a, b in zip(packed_grads, reference_grads)) < 1e-6 * scale
    assert len(pack(examples).input_ids) < sum(len(e.input_ids) for e in examples[:3])


def _system_chats() -> list[list[dict]]:
    """Chats that share a system prompt, as the agent base's transcripts do."""
    system = {"role": "system", "content": "You look people up. Answer with the code only, in one line."}
    return [[system, *chat] for chat in _chats()]


def test_stem_packing_gives_the_loss_and_gradients_of_each_example_alone(tiny_model_dir, device):
    model = _model(tiny_model_dir, device).to(torch.float64)
    tokenizer = _tokenizer(tiny_model_dir)
    examples = [tokenize_chat(tokenizer, chat, 256) for chat in _system_chats()[:3]]
    examples = [*examples, examples[1]]  # a duplicate: its whole path after the stem is fed again
    stem = stem_length(examples)
    first_learned = min(next(i for i, label in enumerate(e.labels) if label != IGNORE) for e in examples)
    assert 10 < stem <= first_learned - 1
    assert examples[0].input_ids[:stem] == examples[2].input_ids[:stem]
    # A row that learns nothing shares no stem and is left out, also when it comes first.
    examples = [Example([0] * 8, [IGNORE] * 8), *examples]
    assert stem_length(examples) == stem
    n_learned = sum(sum(label != IGNORE for label in e.labels[1:]) for e in examples)
    settings = _settings(packing="stem")
    loss_sum = micro_batch_backward(model, examples, settings, n_learned)
    stem_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    reference = _one_row_per_example_loss(model, examples)
    reference_grads = torch.autograd.grad(reference / n_learned, list(model.parameters()))
    assert abs(loss_sum - reference.item()) < 1e-9
    scale = max(g.abs().max().item() for g in reference_grads)
    assert max((a - b).abs().max().item() for a, b in zip(stem_grads, reference_grads)) < 1e-6 * scale
    # One row, rows that differ at once, or a learned token at position 1: no stem (the trie runs).
    assert stem_length(examples[:1]) == 0
    assert stem_length([Example([1, 2, 3], [IGNORE, IGNORE, 3]), Example([4, 2, 3], [IGNORE, IGNORE, 3])]) == 0
    assert stem_length([Example([1, 2, 3], [IGNORE, 2, 3])] * 2) == 0
    assert stem_length([Example([1, 2, 3, 4], [IGNORE, IGNORE, IGNORE, 4])] * 2) == 2


def test_stem_packing_trains_the_adapter_of_trie_packing(tiny_model_dir, device):
    tokenizer = _tokenizer(tiny_model_dir)
    examples = [tokenize_chat(tokenizer, chat, 256) for chat in _system_chats()]
    runs = {
        packing: train_lora(_model(tiny_model_dir, device).to(torch.float64), examples,
                            _settings(steps=2, epochs=None, micro_batch_size=4, packing=packing))
        for packing in ("trie", "stem")
    }
    assert runs["stem"].step_losses == pytest.approx(runs["trie"].step_losses, rel=1e-9)
    a, b = _adapter_weights(runs["trie"].model), _adapter_weights(runs["stem"].model)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)


def test_pack_holds_each_shared_prefix_once_and_no_token_past_the_last_learned_one():
    rows = [
        Example([5, 6, 7, 8, 9], [IGNORE, IGNORE, 7, 8, IGNORE]),  # 8 is the last learned: 8, 9 are never fed
        Example([5, 6, 4], [IGNORE, IGNORE, 4]),
        Example([3, 4], [IGNORE, IGNORE]),  # nothing to learn: left out
    ]
    packed = pack(rows)
    assert packed.input_ids == [5, 6, 7]
    assert packed.positions == [0, 1, 2] and packed.parents == [-1, 0, 1]
    assert packed.predictors == [1, 2, 1] and packed.targets == [7, 8, 4]
    allowed = packed.attention()
    assert allowed.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    branching = pack([Example([1, 2, 3], [IGNORE, 2, 3]), Example([1, 4, 5], [IGNORE, 4, 5])])
    assert branching.input_ids == [1, 2, 4] and branching.positions == [0, 1, 1]
    assert branching.attention().tolist() == [[True, False, False], [True, True, False], [True, False, True]]


def _adapter_weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def test_micro_batches_accumulate_to_the_full_batch(tiny_model_dir, device):
    one = train_lora(_model(tiny_model_dir, device), _examples(tiny_model_dir), _settings(steps=1, epochs=None, micro_batch_size=4))
    split = train_lora(_model(tiny_model_dir, device), _examples(tiny_model_dir), _settings(steps=1, epochs=None, micro_batch_size=1))
    assert one.step_losses == pytest.approx(split.step_losses, rel=1e-5)
    a, b = _adapter_weights(one.model), _adapter_weights(split.model)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_helper_processes_train_the_adapter_of_one_process(learner_dir):  # noqa: F811
    """Each step's micro-batches split between this process and one or two helper processes
    (each on its own thread) give the single process's losses and adapter in every bit."""
    import functools

    from kbench.backends.hf import load_weights
    from kbench.config import ModelConfig

    threads = torch.get_num_threads()
    loader = functools.partial(load_weights, ModelConfig(path=str(learner_dir), device="cpu"))
    # float32 (where the order of a sum shows in its last bits) and the recipe's bf16 autocast
    for precision, helper_counts in (("no", (1, 2)), ("bf16", (1,))):
        settings = _settings(steps=3, epochs=None, micro_batch_size=1, mixed_precision=precision)
        one = train_lora(loader(), _examples(learner_dir), settings)
        for helpers in helper_counts:  # 4 micro-batches a step (then 2): shares of 2 + 2, then 2 + 1 + 1
            split = train_lora(loader(), _examples(learner_dir), settings, helpers=helpers, loader=loader)
            assert split.step_losses == one.step_losses
            a, b = _adapter_weights(one.model), _adapter_weights(split.model)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.get_num_threads() == threads  # the caller's thread count is back


def test_training_is_seeded_and_lowers_the_loss(learner_dir, device):  # noqa: F811
    settings = _settings(epochs=15)
    first = train_lora(_model(learner_dir, device), _examples(learner_dir), settings)
    again = train_lora(_model(learner_dir, device), _examples(learner_dir), settings)
    other = train_lora(_model(learner_dir, device), _examples(learner_dir), _settings(epochs=15, seed=4))
    assert first.step_losses == again.step_losses
    assert first.step_losses != other.step_losses
    assert len(first.epoch_losses) == 15 and len(first.step_losses) == 15 * 2  # 6 examples, batches of 4
    assert first.epoch_losses[-1] < 0.5 * first.epoch_losses[0]
    assert not first.model.training


def test_bf16_mixed_precision_learns_in_bfloat16_and_keeps_float32_weights(learner_dir, device):  # noqa: F811
    settings = _settings(epochs=15, mixed_precision="bf16")
    dtypes = []
    model = _model(learner_dir, device)
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    mixed = train_lora(model, _examples(learner_dir), settings)
    hook.remove()
    again = train_lora(_model(learner_dir, device), _examples(learner_dir), settings)
    full = train_lora(_model(learner_dir, device), _examples(learner_dir), _settings(epochs=15))
    assert set(dtypes) == {torch.bfloat16}  # the products ran in bfloat16
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())  # weights and adapter stay float32
    assert mixed.step_losses == again.step_losses  # seeded: the same bytes
    assert mixed.step_losses != full.step_losses  # another precision, another run
    assert mixed.epoch_losses[-1] < 0.5 * mixed.epoch_losses[0]
    assert abs(mixed.epoch_losses[-1] - full.epoch_losses[-1]) < 0.5 * full.epoch_losses[0]


def test_attention_kernel_is_switched_for_training_only(learner_dir, device):  # noqa: F811
    model = _model(learner_dir, device)
    own = model.config._attn_implementation
    assert own == "sdpa"
    kernels = []
    model.register_forward_pre_hook(lambda m, args: kernels.append((m.training, m.config._attn_implementation)))
    eager = train_lora(model, _examples(learner_dir), _settings(attention="eager"),
                       on_epoch=lambda epoch, m, loss: m(input_ids=torch.tensor([[1, 2, 3]], device=m.device)))
    default = train_lora(_model(learner_dir, device), _examples(learner_dir), _settings())
    assert {kernel for training, kernel in kernels if training} == {"eager"}
    assert {kernel for training, kernel in kernels if not training} == {own}  # the per-pass callback
    assert model.config._attn_implementation == own  # back to its own kernel after training
    assert eager.step_losses != default.step_losses  # another kernel, other rounding
    assert max(abs(a - b) for a, b in zip(eager.step_losses, default.step_losses)) < 1e-3


def test_attention_kernel_is_restored_when_a_step_raises(learner_dir, device):  # noqa: F811
    model = _model(learner_dir, device)
    own = model.config._attn_implementation
    calls = []

    def fail_on_third_training_pass(module, args):
        calls.append(module.config._attn_implementation)
        if module.training and len(calls) == 3:
            raise RuntimeError("step failed")

    model.register_forward_pre_hook(fail_on_third_training_pass)
    with pytest.raises(RuntimeError, match="step failed"):
        train_lora(model, _examples(learner_dir), _settings(attention="eager"))
    assert calls == ["eager"] * 3  # it failed mid-training, under the training kernel
    assert model.config._attn_implementation == own


def test_steps_budget_crosses_epochs_and_calls_back_per_pass(tiny_model_dir, device):
    seen = []
    run = train_lora(
        _model(tiny_model_dir, device), _examples(tiny_model_dir), _settings(steps=5, epochs=None),
        on_epoch=lambda epoch, model, loss: seen.append((epoch, model.training)),
    )
    assert len(run.step_losses) == 5
    assert seen == [(1, False), (2, False), (3, False)]  # passes of 2 steps; the third is cut short


def test_misconfigured_runs_are_refused(tiny_model_dir, device):
    with pytest.raises(ValidationError, match="exactly one"):
        _settings(steps=5)
    with pytest.raises(ValidationError, match="exactly one"):
        _settings(epochs=None)
    with pytest.raises(ValidationError, match="lr_schedule"):
        _settings(lr_schedule="cosine")
    masked = [Example([1, 2, 3], [IGNORE, IGNORE, IGNORE])]
    with pytest.raises(LoraError, match="no example has a token"):
        train_lora(_model(tiny_model_dir, device), masked, _settings())
    with pytest.raises(LoraError, match="no training examples"):
        train_lora(_model(tiny_model_dir, device), [], _settings())


def test_first_layer_adapts_the_layers_from_it_and_stops_the_backward_there(tiny_model_dir, device):
    """`first_layer: 1` puts the adapters "all-linear" puts on layer 1 and none on layer 0, whose
    output then needs no gradient; a layer past the model's last is refused."""
    def adapted(model) -> set[tuple[str, str]]:
        return {(name.split("layers.")[1].split(".")[0], name.split(".lora_A")[0].rsplit(".", 1)[-1])
                for name, _ in model.named_parameters() if "lora_A" in name}

    def run(first_layer: int):
        model, needs_grad = _model(tiny_model_dir, device), []
        model.model.layers[0].register_forward_hook(
            lambda module, inputs, output: needs_grad.append((output[0] if isinstance(output, tuple) else output).requires_grad))
        trained = train_lora(model, _examples(tiny_model_dir), _settings(steps=1, epochs=None, first_layer=first_layer))
        return adapted(trained.model), needs_grad

    every, every_grad = run(0)
    top, top_grad = run(1)
    assert {layer for layer, _ in every} == {"0", "1"} and len(every) == 14  # 7 linear modules a layer
    assert top == {(layer, module) for layer, module in every if layer == "1"}
    assert True in every_grad and not any(top_grad)
    with pytest.raises(LoraError, match="first_layer 2 leaves no layer"):
        train_lora(_model(tiny_model_dir, device), _examples(tiny_model_dir), _settings(first_layer=2))


def test_linear_schedule_decays_to_zero_across_epochs(tiny_model_dir, device):
    examples = _examples(tiny_model_dir)  # 6 examples in batches of 4: 2 steps a pass
    assert total_steps(6, _settings(epochs=3)) == 6 and total_steps(6, _settings(steps=5, epochs=None)) == 5
    constant = train_lora(_model(tiny_model_dir, device), examples, _settings(epochs=3))
    linear = train_lora(_model(tiny_model_dir, device), examples, _settings(epochs=3, lr_schedule="linear"))
    assert constant.step_learning_rates == pytest.approx([1e-2] * 6)
    assert linear.step_learning_rates == pytest.approx([1e-2 * (1 - s / 6) for s in range(6)])
    assert constant.step_losses[0] == pytest.approx(linear.step_losses[0])  # same start, then apart
    assert constant.step_losses[-1] != pytest.approx(linear.step_losses[-1])


def test_micro_batches_put_rows_sharing_a_prefix_together(tiny_model_dir, monkeypatch, device):
    seen = []
    real = kbench.parametric.lora.label_position_loss

    def spy(model, rows):
        seen.append([r.input_ids for r in rows])
        return real(model, rows)

    monkeypatch.setattr(kbench.parametric.lora, "label_position_loss", spy)
    short = _examples(tiny_model_dir)[:4]
    prefixed = [Example([7, 7, 7, *e.input_ids], [IGNORE] * 3 + e.labels) for e in short]
    train_lora(_model(tiny_model_dir, device), [*short, *prefixed], _settings(steps=1, epochs=None, batch_size=8))
    assert [len(rows) for rows in seen] == [2, 2, 2, 2]
    assert sum(rows[0][:3] == [7, 7, 7] and rows[1][:3] == [7, 7, 7] for rows in seen) == 2
    assert micro_batches([*prefixed, *short], 8) == [sorted([*prefixed, *short], key=lambda r: r.input_ids)]


def test_a_single_path_runs_causal_and_a_tree_runs_masked(tiny_model_dir, monkeypatch, device):
    model = _model(tiny_model_dir, device).to(torch.float64)
    example = _examples(tiny_model_dir)[0]
    assert pack([example, example]).is_chain and not pack(_examples(tiny_model_dir)[:2]).is_chain
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: seen.append(sorted(kw)) or forward(**kw))
    alone, _ = label_position_loss(model, [example])
    label_position_loss(model, _examples(tiny_model_dir)[:2])
    assert "attention_mask" not in seen[0] and "attention_mask" in seen[1]
    assert abs(alone.item() - _one_row_per_example_loss(model, [example]).item()) < 1e-9


def test_transformers_linear_schedule_steps_as_the_former_one_in_float32():
    """transformers' (n - s) / n and the former 1 - s / n may differ in a float64 last bit; what an
    AdamW step applies to float32 weights (lr / bias correction, 1 - lr * decay) is the same float32,
    so the switch to `get_scheduler` changes no trained byte (the rates the presets use)."""
    import numpy as np
    from kbench.parametric.lora import optimizer_and_schedule

    for lr in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
        for n in (1, 7, 48, 300, 977):
            _, schedule = optimizer_and_schedule([torch.nn.Parameter(torch.zeros(1))], learning_rate=lr,
                                                 lr_schedule="linear", n_steps=n)
            for s in range(n):
                ours, former = schedule.get_last_lr()[0], lr * (1.0 - s / n)
                bias = 1 - 0.9 ** (s + 1)
                assert np.float32(ours / bias) == np.float32(former / bias)
                assert np.float32(1 - ours * 0.01) == np.float32(1 - former * 0.01)
                schedule.optimizer.step()
                schedule.step()
