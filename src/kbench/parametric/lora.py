"""The one LoRA fine-tuning routine of the project (peft): token ids and label masks in, a trained
peft model and its per-step losses out. Every LoRA trainer (the agent base, the injection
adapters, the calibration trials) goes through `train_lora`, which takes a params `LoraConfig`
section as is (`agent_base.lora`, `injection.lora`).

Memory: a causal LM's full logits are batch x length x vocabulary floats (SmolLM2's 49k vocabulary
at 8 x 1024 tokens is 1.6 GB, several times over once softmax and gradients are kept). The loss
here asks the model for the logits of label positions only (`logits_to_keep` with the positions
that predict a label) and splits every batch into micro-batches whose gradients accumulate, so
peak memory follows the micro-batch and the number of learned tokens, not the vocabulary times
the padded batch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kbench.config import LoraConfig

log = logging.getLogger(__name__)

#: Label of a position that is not learned (the prompt, padding); the Hugging Face convention.
IGNORE = -100


class LoraError(ValueError):
    """A LoRA run cannot start (no examples, no learned token)."""


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids and, per position, the token to learn there or IGNORE."""

    input_ids: list[int]
    labels: list[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise LoraError("an example's input_ids and labels differ in length")


@dataclass
class LoraRun:
    """A trained peft model (in eval mode) and its training curve."""

    model: Any
    step_losses: list[float] = field(default_factory=list)
    #: The learning rate each step ran at (the schedule as applied).
    step_learning_rates: list[float] = field(default_factory=list)
    #: Mean step loss of each completed pass over the examples.
    epoch_losses: list[float] = field(default_factory=list)


#: Called after each completed pass with (epoch number from 1, the peft model, that pass's mean
#: loss). It may evaluate the model (it is switched back to training mode afterwards) or raise to
#: stop the run (Optuna's TrialPruned).
EpochCallback = Callable[[int, Any, float], None]


def tokenize_chat(tokenizer: Any, conversation: Sequence[dict], max_length: int) -> Example:
    """A chat as token ids with its assistant turns (end-of-turn included) as the labels.

    Assistant spans are found by rendering the conversation prefix by prefix, so any chat
    template that renders prefixes consistently works; one that does not is refused.
    """
    text = tokenizer.apply_chat_template(list(conversation), tokenize=False)
    spans = []
    for i, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        opened = tokenizer.apply_chat_template(list(conversation[:i]), tokenize=False, add_generation_prompt=True)
        closed = tokenizer.apply_chat_template(list(conversation[: i + 1]), tokenize=False).rstrip()
        if not (text.startswith(opened) and text.startswith(closed)):
            raise LoraError("the chat template does not render conversations prefix by prefix")
        spans.append((len(opened), len(closed)))
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = encoded["input_ids"][:max_length]
    labels = [
        token if any(start <= offset[0] < end for start, end in spans) else IGNORE
        for token, offset in zip(ids, encoded["offset_mapping"])
    ]
    return Example(ids, labels)


def _batches(n_examples: int, settings: LoraConfig, rng: random.Random) -> Iterator[tuple[int, list[int]]]:
    """(epoch, example indices) per optimizer step: shuffled passes, the last batch of a pass may
    be short; a steps budget runs across passes and stops mid-pass."""
    step = 0
    epoch = 0
    while True:
        epoch += 1
        if settings.epochs is not None and epoch > settings.epochs:
            return
        order = rng.sample(range(n_examples), n_examples)
        for start in range(0, n_examples, settings.batch_size):
            if settings.steps is not None and step >= settings.steps:
                return
            step += 1
            yield epoch, order[start : start + settings.batch_size]


def total_steps(n_examples: int, settings: LoraConfig) -> int:
    """Optimizer steps of a run over `n_examples` (what a linear schedule decays over)."""
    if settings.steps is not None:
        return settings.steps
    return settings.epochs * -(-n_examples // settings.batch_size)


def _padded(rows: list[Example], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    width = max(len(r.input_ids) for r in rows)
    ids = torch.tensor([r.input_ids + [pad_token_id] * (width - len(r.input_ids)) for r in rows], device=device)
    labels = torch.tensor([r.labels + [IGNORE] * (width - len(r.labels)) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r.input_ids) + [0] * (width - len(r.input_ids)) for r in rows], device=device)
    return ids, labels, mask


def label_position_loss(model: Any, rows: list[Example], pad_token_id: int) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the labelled positions of `rows`, and their count.

    Position p predicts token p + 1, so the logits kept are those of positions whose successor
    has a label; every row of the micro-batch is scored at the union of those positions.
    """
    device = next(model.parameters()).device
    input_ids, labels, mask = _padded(rows, pad_token_id, device)
    targets = labels[:, 1:]
    predicting = (targets != IGNORE).any(dim=0).nonzero().squeeze(1)
    if predicting.numel() == 0:
        return torch.zeros((), device=device), 0
    logits = model(input_ids=input_ids, attention_mask=mask, logits_to_keep=predicting).logits
    kept = targets[:, predicting]
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), kept.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return loss, int((kept != IGNORE).sum())


def train_lora(
    model: Any,
    examples: Sequence[Example],
    settings: LoraConfig,
    *,
    pad_token_id: int,
    on_epoch: EpochCallback | None = None,
) -> LoraRun:
    """Wrap `model` in a fresh LoRA adapter and train it on `examples` (AdamW, `lr_schedule`).

    Each step's loss is the mean cross-entropy over the learned tokens of its batch, whatever
    the micro-batching. Seeded: the adapter's initialisation and the example order follow
    `settings.seed`, so the same inputs give the same adapter.
    """
    import peft

    if not examples:
        raise LoraError("no training examples")
    if not any(label != IGNORE for e in examples for label in e.labels[1:]):
        raise LoraError("no example has a token to learn (every label is masked)")
    torch.manual_seed(settings.seed)
    target = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    lora = peft.LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
        target_modules=target, task_type="CAUSAL_LM",
    )
    peft_model = peft.get_peft_model(model, lora)
    peft_model.train()
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=settings.learning_rate)
    n_steps = total_steps(len(examples), settings)
    # Step s (from 0) runs at (1 - s / n_steps) x the rate: the last step still learns something.
    decay = (lambda step: 1.0 - step / n_steps) if settings.lr_schedule == "linear" else (lambda step: 1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    run = LoraRun(model=peft_model)
    epoch_start = 0

    def close_epoch(epoch: int) -> None:
        nonlocal epoch_start
        losses = run.step_losses[epoch_start:]
        run.epoch_losses.append(sum(losses) / len(losses))
        epoch_start = len(run.step_losses)
        log.info("LoRA epoch %d: mean loss %.4f", epoch, run.epoch_losses[-1])
        if on_epoch is not None:
            peft_model.eval()
            on_epoch(epoch, peft_model, run.epoch_losses[-1])
            peft_model.train()

    current_epoch = 1
    for epoch, indices in _batches(len(examples), settings, random.Random(settings.seed)):
        if epoch != current_epoch:
            close_epoch(current_epoch)
            current_epoch = epoch
        # Longest first, so rows of similar length share a micro-batch and pad less (a ReAct
        # transcript is about 2.5 bios long); the step's gradient is the same sum either way.
        rows = sorted((examples[i] for i in indices), key=lambda row: len(row.input_ids), reverse=True)
        n_learned = sum(sum(label != IGNORE for label in r.labels[1:]) for r in rows)
        total = 0.0
        for start in range(0, len(rows), settings.micro_batch_size):
            loss_sum, _ = label_position_loss(peft_model, rows[start : start + settings.micro_batch_size], pad_token_id)
            if loss_sum.requires_grad:
                (loss_sum / max(n_learned, 1)).backward()
            total += loss_sum.item()
        run.step_learning_rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        run.step_losses.append(total / max(n_learned, 1))
        log.info("LoRA step %d (epoch %d): loss %.4f", len(run.step_losses), epoch, run.step_losses[-1])
    if len(run.step_losses) > epoch_start:
        close_epoch(current_epoch)
    peft_model.eval()
    return run
