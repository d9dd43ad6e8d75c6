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
    IGNORE, Example, LoraError, label_position_loss, tokenize_chat, total_steps, train_lora,
)


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


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


def test_label_position_loss_equals_the_full_logits_loss(tiny_model_dir):
    model = _model(tiny_model_dir)
    examples = _examples(tiny_model_dir)[:3]
    loss_sum, count = label_position_loss(model, examples, pad_token_id=0)
    width = max(len(e.input_ids) for e in examples)
    ids = torch.tensor([e.input_ids + [0] * (width - len(e.input_ids)) for e in examples])
    labels = torch.tensor([e.labels + [IGNORE] * (width - len(e.labels)) for e in examples])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(e.input_ids) for e in examples])[:, None]).long()
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert count == sum(sum(label != IGNORE for label in e.labels[1:]) for e in examples)
    assert torch.allclose(loss_sum / count, reference, atol=1e-5)


def _adapter_weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def test_micro_batches_accumulate_to_the_full_batch(tiny_model_dir):
    one = train_lora(_model(tiny_model_dir), _examples(tiny_model_dir), _settings(steps=1, epochs=None, micro_batch_size=4), pad_token_id=0)
    split = train_lora(_model(tiny_model_dir), _examples(tiny_model_dir), _settings(steps=1, epochs=None, micro_batch_size=1), pad_token_id=0)
    assert one.step_losses == pytest.approx(split.step_losses, rel=1e-5)
    a, b = _adapter_weights(one.model), _adapter_weights(split.model)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_training_is_seeded_and_lowers_the_loss(learner_dir):  # noqa: F811
    settings = _settings(epochs=15)
    first = train_lora(_model(learner_dir), _examples(learner_dir), settings, pad_token_id=0)
    again = train_lora(_model(learner_dir), _examples(learner_dir), settings, pad_token_id=0)
    other = train_lora(_model(learner_dir), _examples(learner_dir), _settings(epochs=15, seed=4), pad_token_id=0)
    assert first.step_losses == again.step_losses
    assert first.step_losses != other.step_losses
    assert len(first.epoch_losses) == 15 and len(first.step_losses) == 15 * 2  # 6 examples, batches of 4
    assert first.epoch_losses[-1] < 0.5 * first.epoch_losses[0]
    assert not first.model.training


def test_steps_budget_crosses_epochs_and_calls_back_per_pass(tiny_model_dir):
    seen = []
    run = train_lora(
        _model(tiny_model_dir), _examples(tiny_model_dir), _settings(steps=5, epochs=None),
        pad_token_id=0, on_epoch=lambda epoch, model, loss: seen.append((epoch, model.training)),
    )
    assert len(run.step_losses) == 5
    assert seen == [(1, False), (2, False), (3, False)]  # passes of 2 steps; the third is cut short


def test_misconfigured_runs_are_refused(tiny_model_dir):
    with pytest.raises(ValidationError, match="exactly one"):
        _settings(steps=5)
    with pytest.raises(ValidationError, match="exactly one"):
        _settings(epochs=None)
    with pytest.raises(ValidationError, match="lr_schedule"):
        _settings(lr_schedule="cosine")
    masked = [Example([1, 2, 3], [IGNORE, IGNORE, IGNORE])]
    with pytest.raises(LoraError, match="no example has a token"):
        train_lora(_model(tiny_model_dir), masked, _settings(), pad_token_id=0)
    with pytest.raises(LoraError, match="no training examples"):
        train_lora(_model(tiny_model_dir), [], _settings(), pad_token_id=0)


def test_linear_schedule_decays_to_zero_across_epochs(tiny_model_dir):
    examples = _examples(tiny_model_dir)  # 6 examples in batches of 4: 2 steps a pass
    assert total_steps(6, _settings(epochs=3)) == 6 and total_steps(6, _settings(steps=5, epochs=None)) == 5
    constant = train_lora(_model(tiny_model_dir), examples, _settings(epochs=3), pad_token_id=0)
    linear = train_lora(_model(tiny_model_dir), examples, _settings(epochs=3, lr_schedule="linear"), pad_token_id=0)
    assert constant.step_learning_rates == pytest.approx([1e-2] * 6)
    assert linear.step_learning_rates == pytest.approx([1e-2 * (1 - s / 6) for s in range(6)])
    assert constant.step_losses[0] == pytest.approx(linear.step_losses[0])  # same start, then apart
    assert constant.step_losses[-1] != pytest.approx(linear.step_losses[-1])


def test_micro_batches_group_rows_of_similar_length(tiny_model_dir, monkeypatch):
    widths = []
    real = kbench.parametric.lora.label_position_loss

    def spy(model, rows, pad_token_id):
        widths.append([len(r.input_ids) for r in rows])
        return real(model, rows, pad_token_id)

    monkeypatch.setattr(kbench.parametric.lora, "label_position_loss", spy)
    short = _examples(tiny_model_dir)[:4]
    long = [Example(e.input_ids * 3, e.labels * 3) for e in _examples(tiny_model_dir)[:4]]
    train_lora(_model(tiny_model_dir), [*short, *long], _settings(steps=1, epochs=None, batch_size=8), pad_token_id=0)
    assert [len(w) for w in widths] == [2, 2, 2, 2]
    flat = [w for batch in widths for w in batch]
    assert flat == sorted(flat, reverse=True)  # the long rows share micro-batches, not every one
