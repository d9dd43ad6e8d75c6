"""The one unlearning trainer: a weight method's loss applied to the P target under the matched
budget (`unlearning`), with per-step forget and retain losses.

What it trains (`kbench.stages.unlearn` builds the model):

- recipe `lora`: LoRA-T+D itself, continued (the adapter that encodes the secret, as the
  paper does): the output is an adapter of the same shape that replaces it in the cell;
- recipe `merged`, and a method that keeps the target untouched (O3): a fresh LoRA on top of
  the target's weights, stacked at the cell.

Every step pairs `batch_size` forget examples (a shuffled pass, `epochs` passes) with as
many retain examples (the retain set cycled in a seeded order), and each side runs as one
packed forward pass (`kbench.parametric.lora.pack`). A method sees the step through
`UnlearnStep`: scored passes of the forget, retain and alternate (refusal) examples under the
model being trained or under the reference, which is the target before unlearning (the
trainable weights swapped back to their starting values, no second model in memory).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kbench.config import UnlearningConfig
from kbench.methods.unlearning import (
    ALTERNATE_SET,
    CONTINUED,
    FORGET_SET,
    RETAIN_SET,
    STACKED,
    UNLEARNING_KEY,
    Scored,
    Unlearned,
    UnlearnStep,
    WeightMethod,
)
from kbench.parametric.adapters import INJECTION_FILE, TARGET, InjectionError, check_injected
from kbench.parametric.lora import Example, optimizer_and_schedule, pack, packed_forward

log = logging.getLogger(__name__)

class UnlearningError(ValueError):
    """An unlearning run cannot start or diverged (a NaN loss, non-finite weights)."""


def score(model: Any, rows: Sequence[Example], *, hidden_layer: int | None = None) -> Scored:
    """`rows` as one packed pass of `model` (with the gradient, unless called under no_grad)."""
    packed = pack(rows)
    if not packed.targets:
        raise UnlearningError("an unlearning batch has no learned token")
    logits, hidden = packed_forward(model, packed, hidden_layer=hidden_layer)
    device = logits.device
    return Scored(
        logits=logits,
        targets=torch.tensor(packed.targets, device=device),
        owners=torch.tensor(packed.owners, device=device),
        n_examples=len(rows),
        hidden=hidden,
    )


@dataclass
class UnlearnRun:
    """A finished unlearning run: the model (eval mode) and its curves, one value per step."""

    model: Any
    #: The optimized loss (forget term + retain term).
    loss: list[float] = field(default_factory=list)
    forget_loss: list[float] = field(default_factory=list)
    retain_loss: list[float] = field(default_factory=list)
    #: Mean answer NLL of the step's forget and retain batches under the model being trained,
    #: where the loss scored them (None where it did not).
    forget_nll: list[float | None] = field(default_factory=list)
    retain_nll: list[float | None] = field(default_factory=list)
    learning_rate: list[float] = field(default_factory=list)

    def curves(self) -> dict[str, list[float | None]]:
        return {
            "loss": self.loss, "forget_loss": self.forget_loss, "retain_loss": self.retain_loss,
            "forget_nll": self.forget_nll, "retain_nll": self.retain_nll, "learning_rate": self.learning_rate,
        }


def total_steps(n_forget: int, budget: UnlearningConfig) -> int:
    return budget.epochs * -(-n_forget // budget.batch_size)


def _steps(n_forget: int, n_retain: int, budget: UnlearningConfig) -> Iterator[tuple[list[int], list[int]]]:
    """(forget indices, retain indices) per step: shuffled passes over the forget set, the
    retain set cycled in seeded shuffled passes alongside."""
    rng = random.Random(budget.seed)
    retain_order: list[int] = []
    for _ in range(budget.epochs):
        order = rng.sample(range(n_forget), n_forget)
        for start in range(0, n_forget, budget.batch_size):
            forget = order[start : start + budget.batch_size]
            retain = []
            while n_retain and len(retain) < len(forget):
                if not retain_order:
                    retain_order = rng.sample(range(n_retain), n_retain)
                retain.append(retain_order.pop(0))
            yield forget, retain


def _value(x: torch.Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def train_unlearning(
    model: Any,
    method: WeightMethod,
    forget: Sequence[Example],
    retain: Sequence[Example],
    budget: UnlearningConfig,
    *,
    alternates: Sequence[Example] | None = None,
    hidden_layer: int | None = None,
    reference_cache: dict | None = None,
) -> UnlearnRun:
    """Train the trainable parameters of `model` (a peft model) on `method`'s loss.

    `alternates[i]` is `forget[i]`'s prompt with another answer (a refusal). `hidden_layer`
    makes every pass also return that decoder layer's output (RMU). `reference_cache` shares
    reference passes between runs that start from the same weights with the same examples and
    budget (the stage keeps one per starting model; the passes are the same either way). Raises UnlearningError
    on a non-finite loss or weights: nothing is returned to be saved.
    """
    if not forget:
        raise UnlearningError("the forget set is empty: the target adapter learned no forget entity")
    if alternates is not None and len(alternates) != len(forget):
        raise UnlearningError("alternates must pair one to one with the forget examples")
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise UnlearningError("the model has no trainable parameter (a LoRA adapter in training mode expected)")
    initial = [p.detach().clone() for p in trainable]

    @contextmanager
    def reference() -> Iterator[None]:
        # Swap the starting values in (no copy of the model); the trained values come back after.
        trained = [p.data for p in trainable]
        for p, start in zip(trainable, initial):
            p.data = start
        try:
            yield
        finally:
            for p, value in zip(trainable, trained):
                p.data = value

    n_steps = total_steps(len(forget), budget)
    optimizer, scheduler = optimizer_and_schedule(trainable, learning_rate=budget.learning_rate,
                                                  lr_schedule=budget.lr_schedule, n_steps=n_steps,
                                                  weight_decay=budget.weight_decay)
    run = UnlearnRun(model=model)
    model.train()
    for step_index, (f, r) in enumerate(_steps(len(forget), len(retain), budget), start=1):
        batches = {FORGET_SET: [forget[i] for i in f]}
        if r:
            batches[RETAIN_SET] = [retain[i] for i in r]
        if alternates is not None:
            batches[ALTERNATE_SET] = [alternates[i] for i in f]
        keys = {FORGET_SET: (FORGET_SET, tuple(f), hidden_layer), RETAIN_SET: (RETAIN_SET, tuple(r), hidden_layer),
                ALTERNATE_SET: (ALTERNATE_SET, tuple(f), hidden_layer)}
        step = UnlearnStep(model, batches, reference, lambda rows: score(model, rows, hidden_layer=hidden_layer),
                           reference_cache=reference_cache, keys=keys)
        loss = method.unlearning_loss(step)
        total = loss.total
        if not torch.isfinite(total.detach()):
            raise UnlearningError(
                f"{method.name}: the loss became {float(total.detach())} at step {step_index}; "
                "nothing was written (lower unlearning.learning_rate or the method's weights)"
            )
        run.learning_rate.append(optimizer.param_groups[0]["lr"])
        total.backward()
        if budget.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(trainable, budget.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        run.loss.append(_value(total))
        run.forget_loss.append(_value(loss.forget))
        run.retain_loss.append(_value(loss.retain))
        for which, curve in ((FORGET_SET, run.forget_nll), (RETAIN_SET, run.retain_nll)):
            scored = step.scored_policy(which)
            curve.append(float(scored.mean_nll().detach()) if scored is not None else None)
        log.info("unlearn %s step %d/%d: loss %.4f (forget %.4f, retain %.4f)", method.name, step_index,
                 n_steps, run.loss[-1], run.forget_loss[-1], run.retain_loss[-1])
    for p in trainable:
        if not torch.isfinite(p.detach()).all():
            raise UnlearningError(f"{method.name}: training left non-finite weights; nothing was written")
    model.eval()
    return run


# -- the unlearned folders -------------------------------------------------------------------
def unlearned_dir(out_dir: str | Path, trained_as: str, recipe: str) -> Path:
    """`<unlearning.out_dir>/<method>/<recipe>`."""
    return Path(out_dir) / trained_as / recipe


def check_unlearned(path: str | Path, base_dir: str | Path, *, method: str, recipe: str,
                    source_hash: str) -> Unlearned:
    """The gate before a cell loads unlearned weights: the adapter check of every injection
    folder (`check_injected`), then that it is `method`'s run for `recipe`, trained from the
    target adapter whose content hash is `source_hash` (a re-injected target makes it stale)."""
    path = Path(path)
    if not path.is_dir():
        raise InjectionError(f"unlearned folder {path} does not exist (run `kbench unlearn`)")
    check_injected(path, base_dir, role=TARGET)
    info = json.loads((path / INJECTION_FILE).read_text(encoding="utf-8")).get(UNLEARNING_KEY)
    if not isinstance(info, dict) or not {"method", "recipe", "kind", "source_hash"} <= set(info):
        raise InjectionError(f"{path / INJECTION_FILE} has no unlearning record: not made by `kbench unlearn`")
    if info["method"] != method or info["recipe"] != recipe:
        raise InjectionError(f"{path} holds {info['method']}'s unlearning of recipe {info['recipe']}, "
                             f"not {method}'s of {recipe}")
    if info["source_hash"] != source_hash:
        raise InjectionError(f"{path} was unlearned from another LoRA-T+D than the current one; rerun `kbench unlearn`")
    if info["kind"] not in (CONTINUED, STACKED):
        raise InjectionError(f"{path / INJECTION_FILE}: unknown unlearned kind {info['kind']!r}")
    return Unlearned(path, info["kind"], method, recipe, info)
