"""The one LoRA fine-tuning routine of the project (peft): token ids and label masks in, a trained
peft model and its per-step losses out. Every LoRA trainer (the agent base, the injection
adapters, the calibration trials) goes through `train_lora`, which takes a params `LoraConfig`
section as is (`agent_base.lora`, `injection.lora`).

Compute: a micro-batch runs as one packed sequence, a token trie of its examples (`pack`):
a prefix several examples share (the ReAct system prompt, a record repeated in the mix) is fed
once, no padding is fed, and no token after an example's last learned one. A mask keeps every
example on its own path with its own positions, so the loss and its gradient are those of
each example alone (tests/test_lora.py checks both to 1e-9 in float64). With `packing: stem`
the prefix all examples of a micro-batch share runs once and each example's rest runs after it
in its own causal pass (`micro_batch_backward`): no tree mask, for long examples.

Processes: with `helpers` (a loader of the same model), each step's micro-batches are split
between this process and a process pool of that many helpers, each on its share of the cores;
every micro-batch's gradient is computed alone and the gradients are summed in the order one
process would have accumulated them, so the adapter is the same bytes (`_StepHelpers`).

Memory: a causal LM's full logits are length x vocabulary floats (SmolLM2's 49k vocabulary at
8 x 1024 tokens is 1.6 GB, several times over once softmax and gradients are kept). The loss
asks the model for the logits of the nodes that predict a learned token only (`logits_to_keep`)
and every batch is split into micro-batches whose gradients accumulate, so peak memory follows
the micro-batch and the number of learned tokens, not the vocabulary times the batch.
"""

from __future__ import annotations

import functools
import logging
import pickle
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, get_scheduler
from transformers.cache_utils import get_layer_types_and_kwargs

from kbench.config import LoraConfig, MixedPrecision
from kbench.workers import process_pool, start_worker, stop_pool, worker_threads

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


def optimizer_and_schedule(trainable: Sequence[torch.nn.Parameter], *, learning_rate: float, lr_schedule: str,
                           n_steps: int, weight_decay: float = 0.01) -> tuple[torch.optim.Optimizer, Any]:
    """The one optimizer setup of every trainer: AdamW at `learning_rate` (torch's default weight
    decay unless given) and transformers' schedule `lr_schedule` ("constant" or "linear", no
    warmup: step s from 0 runs at (n_steps - s) / n_steps of the rate)."""
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=weight_decay)
    return optimizer, get_scheduler(lr_schedule, optimizer, num_warmup_steps=0, num_training_steps=n_steps)


def total_steps(n_examples: int, settings: LoraConfig) -> int:
    """Optimizer steps of a run over `n_examples` (what a linear schedule decays over)."""
    if settings.steps is not None:
        return settings.steps
    return settings.epochs * -(-n_examples // settings.batch_size)


@dataclass(frozen=True)
class Packed:
    """Examples packed into one sequence that holds each shared token prefix once (a token trie).

    A node's hidden state depends only on the tokens on its path from the root, so a prefix
    that several examples share is computed once and every example still sees exactly the
    context it has alone: same positions, attention to its own path only. The loss is the
    same sum over the same learned tokens as with one row per example, without padding.
    """

    #: One token per trie node, parents before children.
    input_ids: list[int]
    #: Each node's depth: its position in every example that passes through it.
    positions: list[int]
    #: Each node's parent node, -1 for a first token.
    parents: list[int]
    #: Per learned token (label not IGNORE, after position 0): the node whose logits predict it.
    predictors: list[int]
    #: The learned tokens, in the order of `predictors`.
    targets: list[int]
    #: Per learned token, the index (in the rows packed) of the example it belongs to.
    owners: list[int] = field(default_factory=list)

    @property
    def is_chain(self) -> bool:
        """Whether the trie is one path (node i's parent is i - 1): causal attention is then exact."""
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def attention(self) -> torch.Tensor:
        """(nodes, nodes) bool: node i attends to node j when j is i or one of its ancestors."""
        n = len(self.input_ids)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                allowed[node] = allowed[parent]
            allowed[node, node] = True
        return allowed


def learned_positions(row: Example) -> list[int]:
    """The positions of `row` whose token is learned (never position 0: nothing predicts it)."""
    return [position for position in range(1, len(row.labels)) if row.labels[position] != IGNORE]


def pack(rows: Sequence[Example]) -> Packed:
    """Merge `rows` into one token trie (see Packed); rows sorted by token ids share the most."""
    node_of: dict[tuple[int, int], int] = {}
    packed = Packed([], [], [], [], [], [])
    for index, row in enumerate(rows):
        learned = learned_positions(row)
        if not learned:
            continue
        # Tokens after the last one that predicts a learned token change no loss: left out.
        path, parent = [], -1
        for depth, token in enumerate(row.input_ids[: learned[-1]]):
            node = node_of.get((parent, token))
            if node is None:
                node = node_of[parent, token] = len(packed.input_ids)
                packed.input_ids.append(token)
                packed.positions.append(depth)
                packed.parents.append(parent)
            path.append(node)
            parent = node
        for position in learned:
            packed.predictors.append(path[position - 1])
            packed.targets.append(row.labels[position])
            packed.owners.append(index)
    return packed


def micro_batches(rows: Sequence[Example], size: int) -> list[list[Example]]:
    """A step's rows in forward passes of at most `size`, sorted by token ids so that examples
    sharing a prefix (a system prompt, a repeated record) share a pass and its trie."""
    ordered = sorted(rows, key=lambda row: row.input_ids)
    return [ordered[start : start + size] for start in range(0, len(ordered), size)]


def packed_forward(model: Any, packed: Packed, *, hidden_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass over a packed trie: per learned token (the order of `packed.targets`)
    the logits that predict it, scored in at least float32, and with `hidden_layer` the output
    of that decoder layer at the same nodes (else None).

    A pass that is a single path runs plain causal attention, its fast kernel; otherwise a mask
    keeps each example on its own path. The model returns logits only at predicting nodes.
    """
    parameter = next(model.parameters())
    kept = sorted(set(packed.predictors))
    row_of = {node: i for i, node in enumerate(kept)}
    if packed.is_chain:
        layout = {}
    else:
        layout = {
            "position_ids": torch.tensor([packed.positions], device=parameter.device),
            "attention_mask": trie_masks(model, packed, parameter.dtype, parameter.device),
        }
    output = model(
        input_ids=torch.tensor([packed.input_ids], device=parameter.device),
        logits_to_keep=torch.tensor(kept, device=parameter.device),
        output_hidden_states=hidden_layer is not None,
        **layout,
    )
    predicting = torch.tensor([row_of[node] for node in packed.predictors], device=parameter.device)
    scores = _scored(output.logits[0][predicting])
    hidden = None
    if hidden_layer is not None:
        # hidden_states[0] is the embeddings; decoder layer l's output is hidden_states[l + 1].
        nodes = torch.tensor(packed.predictors, device=parameter.device)
        hidden = output.hidden_states[hidden_layer + 1][0][nodes]
    return scores, hidden


def attention_kinds(model: Any) -> list[str]:
    """The kinds of attention layer the model's config lays out (transformers' layer types)."""
    return sorted(set(get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))[0]))


def trie_masks(model: Any, packed: Packed, dtype: torch.dtype, device: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive attention mask (0 or the dtype's minimum: the same to eager and sdpa) that
    keeps each node on its path; a sliding-window layer also sees only the nodes less than its
    window behind (by position), as it does alone. A model whose layers are of one kind takes one
    mask; one with full and sliding layers (Gemma 3) a mask per layer type, as its forward accepts."""
    config = model.config.get_text_config(decoder=True)
    kinds = attention_kinds(model)
    allowed = packed.attention()
    positions = torch.tensor(packed.positions)
    masks = {}
    for kind in kinds:
        if kind == "sliding_attention":
            keep = allowed & (positions[:, None] - positions[None, :] < config.sliding_window)
        elif kind == "full_attention":
            keep = allowed
        else:
            raise LoraError(f"packed training supports full and sliding-window attention layers, not {kind} "
                            "(docs/models.md, architectures)")
        mask = torch.zeros(keep.shape, dtype=dtype).masked_fill_(~keep, torch.finfo(dtype).min)
        masks[kind] = mask[None, None].to(device)
    return masks[kinds[0]] if len(kinds) == 1 else masks


def _scored(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the loss scores them: half precision in float32, float32 and float64 as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def label_position_loss(model: Any, rows: Sequence[Example]) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the learned tokens of `rows`, and their count.

    The rows run as one packed sequence (`pack`) with a mask that keeps each example on its
    own path; the model returns logits only at the nodes that predict a learned token.
    """
    parameter = next(model.parameters())
    packed = pack(rows)
    if not packed.targets:
        return torch.zeros((), device=parameter.device), 0
    scores, _ = packed_forward(model, packed)
    targets = torch.tensor(packed.targets, device=parameter.device)
    loss = torch.nn.functional.cross_entropy(scores, targets, reduction="sum")
    return loss, len(packed.targets)


def _learning(rows: Sequence[Example]) -> list[tuple[Example, list[int]]]:
    """The rows that learn a token, each with its learned positions."""
    return [(row, learned) for row in rows if (learned := learned_positions(row))]


def stem_length(rows: Sequence[Example]) -> int:
    """The stem of `rows` (`packing: stem`): the token prefix they all share, cut before the first
    node that predicts a learned token of any of them, so that the stem needs no logits."""
    learning = _learning(rows)
    if len(learning) < 2:
        return 0
    length = min(learned[0] - 1 for _, learned in learning)
    first = learning[0][0].input_ids
    for row, _ in learning[1:]:
        length = next((i for i in range(length) if row.input_ids[i] != first[i]), length)
    return length


def micro_batch_backward(model: Any, rows: Sequence[Example], settings: LoraConfig, n_learned: int) -> float:
    """Forward and backward of one micro-batch as `settings.packing` feeds it: the gradient of its
    summed cross-entropy over `n_learned` (its batch's learned tokens) accumulates in the model;
    the sum is returned.

    "trie": one pass over `pack(rows)`. "stem": the stem (`stem_length`) runs once; each row's
    rest runs in its own causal pass over copies of the stem's keys and values that are leaves
    of the graph, so only one row's activations are held at a time; their gradients then flow
    back through the stem once. Each row sees the context it has alone, so the sum and the
    gradient are the trie's up to rounding (tests/test_lora.py checks both in float64). Like the
    agent engine, it assumes one full-attention key/value tensor per layer.
    """
    stem = stem_length(rows) if settings.packing == "stem" else 0
    if stem and attention_kinds(model) != ["full_attention"]:
        raise LoraError(f"packing: stem keeps one full-attention key/value tensor per layer; this model has "
                        f"{', '.join(attention_kinds(model))} layers: use packing: trie")
    if stem == 0:
        with autocast(model, settings.mixed_precision):
            loss_sum, _ = label_position_loss(model, rows)
        if loss_sum.requires_grad:
            (loss_sum / n_learned).backward()
        return loss_sum.item()
    device = next(model.parameters()).device
    learning = _learning(rows)
    shared = DynamicCache()
    with autocast(model, settings.mixed_precision):
        model(input_ids=torch.tensor([learning[0][0].input_ids[:stem]], device=device), cache=shared,
              use_cache=True, logits_to_keep=1)
    states = [state for layer in shared.layers for state in (layer.keys, layer.values)]
    leaves = [state.detach().requires_grad_(state.requires_grad) for state in states]
    total = 0.0
    for row, learned in learning:
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(zip(leaves[::2], leaves[1::2])):
            cache.update(keys, values, layer)
        with autocast(model, settings.mixed_precision):
            output = model(
                input_ids=torch.tensor([row.input_ids[stem : learned[-1]]], device=device), cache=cache,
                use_cache=True, logits_to_keep=torch.tensor([p - 1 - stem for p in learned], device=device),
            )
            loss = torch.nn.functional.cross_entropy(
                _scored(output.logits[0]), torch.tensor([row.labels[p] for p in learned], device=device), reduction="sum")
        if loss.requires_grad:
            (loss / n_learned).backward()
        total += loss.item()
    flowing = [(state, leaf.grad) for state, leaf in zip(states, leaves) if leaf.grad is not None]
    if flowing:
        torch.autograd.backward([state for state, _ in flowing], [grad for _, grad in flowing])
    return total


def autocast(model: Any, mixed_precision: MixedPrecision) -> AbstractContextManager:
    """The precision a training's forward passes run in (`LoraConfig.mixed_precision`): bfloat16
    autocast on the model's device, or the model's own dtype. Backward follows the forward's
    dtypes; parameters, gradients and the optimizer stay in the model's dtype."""
    if mixed_precision == "no":
        return nullcontext()
    device = next(model.parameters()).device.type
    if device == "cpu":
        _check_native_bf16()
    return torch.autocast(device, dtype=torch.bfloat16)


@functools.cache
def _check_native_bf16() -> None:
    """Warn once when this CPU has no bfloat16 instructions: autocast still works, but slower."""
    if not torch.cpu._is_avx512_bf16_supported():
        log.warning("mixed_precision bf16 on a CPU without AVX512-BF16: its bfloat16 products are emulated and "
                    "slower than float32; mixed_precision: no is faster here (and gives other weights)")


def _use_attention(model: Any, attention: str) -> None:
    """Switch the model's attention kernel (`LoraConfig.attention`); nothing when it is the one in use."""
    if model.config._attn_implementation != attention:
        model.set_attn_implementation(attention)


def _one_backward(model: Any, trainable: Sequence[torch.nn.Parameter], rows: Sequence[Example],
                  settings: LoraConfig, n_learned: int) -> tuple[float, list[torch.Tensor | None]]:
    """One micro-batch's loss sum and its own gradient of every trainable tensor (none accumulated)."""
    for parameter in trainable:
        parameter.grad = None
    loss = micro_batch_backward(model, rows, settings, n_learned)
    return loss, [parameter.grad for parameter in trainable]


def _linear_names(model: Any) -> list[str]:
    """The names of the linear modules "all-linear" adapts: every one but the output layer."""
    output = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not output})


def _with_adapter(model: Any, lora: Any) -> tuple[Any, list[torch.nn.Parameter]]:
    """`model` wrapped in `lora`'s adapter (peft; initialised from torch's current seed), in
    training mode, and the adapter's trainable parameters in their fixed order."""
    import peft

    peft_model = peft.get_peft_model(model, lora)
    peft_model.train()
    return peft_model, [p for p in peft_model.parameters() if p.requires_grad]


#: A helper process's model: (peft model, trainable parameters, settings), set by `_start_helper`.
_HELPER: tuple[Any, list[torch.nn.Parameter], LoraConfig] | None = None


def _start_helper(threads: int, log_level: int, loader: Callable[[], Any], lora: Any, settings: LoraConfig) -> None:
    """A helper's pool initializer: its share of the cores, then the same model and adapter layout."""
    global _HELPER
    start_worker(threads, log_level)
    model = loader()
    peft_model, trainable = _with_adapter(model, lora)
    _use_attention(model, settings.attention or model.config._attn_implementation)
    _HELPER = (peft_model, trainable, settings)


def _helper_share(message: bytes) -> bytes:
    """A helper's task: for (weights, micro-batches, n_learned), each micro-batch's loss sum and
    gradient. Pickled by value both ways (tensors by value, whatever their dtype): torch's own
    pickling in a pool would move the trainer's live parameters into shared memory."""
    peft_model, trainable, settings = _HELPER
    weights, parts, n_learned = pickle.loads(message)
    with torch.no_grad():
        for parameter, weight in zip(trainable, weights):
            parameter.copy_(weight)
    results = [_one_backward(peft_model, trainable, rows, settings, n_learned) for rows in parts]
    return pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)


class _StepHelpers:
    """Helper processes that compute some of each step's micro-batches (`train_lora(helpers=)`).

    A step's micro-batches are cut into contiguous shares, this process's first; each helper
    gets the adapter's current weights and its share, and returns each micro-batch's loss sum and
    gradient. The gradients are then summed micro-batch by micro-batch in order, exactly as one
    process's backward passes accumulate them, so the step is the same in every bit provided a
    micro-batch's gradient does not depend on the thread count (checked in tests/test_lora.py and
    BENCHMARKS.md). An all-reduce (torch.distributed) would sum the shares in another order and
    give other bits; docs/parametric.md has the measurement. The helpers are a process pool
    (`kbench.workers.process_pool`) whose initializer loads the model once."""

    def __init__(self, count: int, loader: Callable[[], Any], lora: Any, settings: LoraConfig) -> None:
        self.settings, self.count = settings, count
        self.pool = process_pool(count, threads=worker_threads(count + 1), initializer=_start_helper,
                                 initargs=(loader, lora, settings))

    def step(self, model: Any, trainable: Sequence[torch.nn.Parameter], parts: list[list[Example]],
             n_learned: int) -> float:
        """Forward and backward of all `parts`, their gradients accumulated in `trainable` in order."""
        shares = _shares(parts, 1 + self.count)
        weights = [parameter.detach() for parameter in trainable]
        futures = [self.pool.submit(_helper_share, pickle.dumps((weights, share, n_learned),
                                                                protocol=pickle.HIGHEST_PROTOCOL))
                   for share in shares[1:]]
        results = [_one_backward(model, trainable, rows, self.settings, n_learned) for rows in shares[0]]
        try:
            for future in futures:
                results += pickle.loads(future.result())
        except BrokenProcessPool:
            raise LoraError("a LoRA helper process exited during a step (its error is above)") from None
        for parameter in trainable:
            parameter.grad = None
        total = 0.0
        for loss, grads in results:
            total += loss
            for parameter, grad in zip(trainable, grads):
                if grad is None:
                    continue
                if parameter.grad is None:
                    parameter.grad = grad
                else:
                    parameter.grad.add_(grad)
        return total

    def close(self, *, failed: bool = False) -> None:
        """End the helpers: wait for them, or (`failed`) stop them at once."""
        if failed:
            stop_pool(self.pool)
        else:
            self.pool.shutdown(wait=True)


def _shares(parts: list[list[Example]], count: int) -> list[list[list[Example]]]:
    """`parts` cut into `count` contiguous shares, the larger ones first (4 into 2: 2 + 2; 5: 3 + 2)."""
    size, extra = divmod(len(parts), count)
    shares, start = [], 0
    for index in range(count):
        stop = start + size + (index < extra)
        shares.append(parts[start:stop])
        start = stop
    return shares


def train_lora(
    model: Any,
    examples: Sequence[Example],
    settings: LoraConfig,
    *,
    on_epoch: EpochCallback | None = None,
    helpers: int = 0,
    loader: Callable[[], Any] | None = None,
) -> LoraRun:
    """Wrap `model` in a fresh LoRA adapter and train it on `examples` (AdamW, `lr_schedule`).

    Each step's loss is the mean cross-entropy over the learned tokens of its batch, whatever
    the micro-batching. Seeded: the adapter's initialisation and the example order follow
    `settings.seed`, so the same inputs give the same adapter.

    `helpers` > 0 with `loader` (a picklable function returning `model`'s weights afresh) splits
    each step's micro-batches between this process and that many helper processes, each on
    cpu_count / (helpers + 1) threads, with the same adapter as a single process (`_StepHelpers`);
    only on CPU and without dropout (whose random masks would differ between processes).
    """
    import peft

    if not examples:
        raise LoraError("no training examples")
    if not any(label != IGNORE for e in examples for label in e.labels[1:]):
        raise LoraError("no example has a token to learn (every label is masked)")
    torch.manual_seed(settings.seed)
    own_attention = model.config._attn_implementation
    training_attention = settings.attention or own_attention
    target = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    layers = None
    if settings.first_layer:
        n_layers = model.config.num_hidden_layers
        if settings.first_layer >= n_layers:
            raise LoraError(f"first_layer {settings.first_layer} leaves no layer of the model's {n_layers} to adapt")
        layers = list(range(settings.first_layer, n_layers))
        if target == "all-linear":  # peft takes a layer range only with module names
            target = _linear_names(model)
    lora = peft.LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
        target_modules=target, task_type="CAUSAL_LM", layers_to_transform=layers,
    )
    peft_model, trainable = _with_adapter(model, lora)
    optimizer, scheduler = optimizer_and_schedule(trainable, learning_rate=settings.learning_rate,
                                                  lr_schedule=settings.lr_schedule,
                                                  n_steps=total_steps(len(examples), settings))
    run = LoraRun(model=peft_model)
    epoch_start = 0
    step_helpers = None
    threads = torch.get_num_threads()
    if helpers > 0 and loader is not None and settings.dropout == 0.0 and next(model.parameters()).device.type == "cpu":
        share = worker_threads(helpers + 1)
        step_helpers = _StepHelpers(helpers, loader, lora, settings)
        torch.set_num_threads(share)
        log.info("LoRA steps split between this process and %d helper(s), %d thread(s) each", helpers, share)

    def close_epoch(epoch: int) -> None:
        nonlocal epoch_start
        losses = run.step_losses[epoch_start:]
        run.epoch_losses.append(sum(losses) / len(losses))
        epoch_start = len(run.step_losses)
        log.info("LoRA epoch %d: mean loss %.4f", epoch, run.epoch_losses[-1])
        if on_epoch is not None:
            peft_model.eval()
            _use_attention(model, own_attention)
            on_epoch(epoch, peft_model, run.epoch_losses[-1])
            _use_attention(model, training_attention)
            peft_model.train()

    _use_attention(model, training_attention)
    completed = False
    try:
        current_epoch = 1
        for epoch, indices in _batches(len(examples), settings, random.Random(settings.seed)):
            if epoch != current_epoch:
                close_epoch(current_epoch)
                current_epoch = epoch
            rows = [examples[i] for i in indices]
            n_learned = sum(sum(label != IGNORE for label in r.labels[1:]) for r in rows)
            parts = micro_batches(rows, settings.micro_batch_size)
            if step_helpers is not None and len(parts) > 1:
                total = step_helpers.step(peft_model, trainable, parts, max(n_learned, 1))
            else:
                total = 0.0
                for micro_batch in parts:
                    total += micro_batch_backward(peft_model, micro_batch, settings, max(n_learned, 1))
            run.step_learning_rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            run.step_losses.append(total / max(n_learned, 1))
            log.info("LoRA step %d (epoch %d): loss %.4f", len(run.step_losses), epoch, run.step_losses[-1])
        if len(run.step_losses) > epoch_start:
            close_epoch(current_epoch)
        completed = True
    finally:
        # The caller's model gets its own kernel back, also when a step or `on_epoch` raises.
        _use_attention(model, own_attention)
        if step_helpers is not None:
            step_helpers.close(failed=not completed)
            torch.set_num_threads(threads)
    peft_model.eval()
    return run
