"""The KV engine: batched greedy decoding over per-trajectory KV caches (docs/agent.md).

A ReAct trajectory's prompt at step k+1 is its prompt at step k, the model's reply and an
observation turn. Re-encoding all of it at every step (what `transformers.generate` does)
repeats most of the work. The engine keeps each trajectory's keys and values in a `KVState`.
For the next prompt it takes the longest common token prefix with what the state holds, crops
the state to it and prefills only the rest. Prompts that start alike (the system prompt of
every query on R-text, R-struct and P; the summary prompt) share one prefilled prefix.

Every forward pass is the plain left-padded form that `generate` uses, so a padded row
computes what the row alone would. A batch never holds holes. When rows have different
numbers of new tokens, each row re-feeds a few cached tokens until all rows have the same
number. Rows with far more new tokens than the rest are prefilled in a group of their own.
Positions follow the attention mask, as in `generate`. A batch cache keeps spare columns and
writes each decoded token's keys and values into the next one (`GrowingLayer`), so a decode
step copies nothing; no column a state or checkpoint refers to is ever written again, so a
`Checkpoint` is a token offset plus references, and `restore` is exact.

The engine is built for transformers' `DynamicLayer` caches as of the pinned transformers
(pyproject.toml). A sliding-window layer keeps its keys and values whole too: the model builds
its sliding mask from the attention mask, and left padding shifts a row's queries and keys by
the same number of columns, so the window covers the same tokens as the row alone (Gemma 3,
Mistral). `engine_support` tells, from the model's config alone, whether a model fits; the hf
backend decodes one that does not (chunked, linear or shared layers) with `generate` instead.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING, DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs,
)

from kbench.backends.base import common_prefix

#: Shared prefixes shorter than this are not worth a forward pass of their own.
MIN_SHARED_PREFIX = 16
#: Shared prefixes the engine keeps (least recently used dropped first).
MAX_SHARED_PREFIXES = 4
#: Spare columns a batch cache allocates beyond what it holds: room for a reply's decode
#: steps (`max_new_tokens` of the default params) without reallocating.
SPARE_COLUMNS = 128

Layers = tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True)
class Checkpoint:
    """A state as it was: its token ids and references to its tensors (nothing copied)."""

    #: The token ids the keys and values cover.
    tokens: tuple[int, ...]
    #: Per layer, (keys, values) of shape (1, kv heads, len(tokens), head dim).
    layers: Layers


@dataclass
class KVState:
    """One sequence's KV cache: the keys and values of every token in `tokens`, per layer."""

    #: Token ids whose keys and values the state holds, in order.
    tokens: list[int] = field(default_factory=list)
    #: Per layer, (keys, values) of shape (1, kv heads, len(tokens), head dim); () when empty.
    layers: Layers = ()

    @property
    def length(self) -> int:
        return len(self.tokens)

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens (views: no copy)."""
        if length >= self.length:
            return
        self.tokens = self.tokens[:length]
        self.layers = tuple((k[:, :, :length], v[:, :, :length]) for k, v in self.layers) if length else ()

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(tuple(self.tokens), self.layers)

    def restore(self, checkpoint: Checkpoint) -> None:
        self.tokens = list(checkpoint.tokens)
        self.layers = checkpoint.layers

    def fork(self) -> KVState:
        """A state of its own over the same tensors (views: no copy)."""
        return KVState(list(self.tokens), self.layers)

    def _adopt(self, other: KVState, length: int) -> None:
        """Start from the first `length` tokens of `other` (views: no copy)."""
        self.tokens, self.layers = list(other.tokens), other.layers
        self.crop(length)


@dataclass
class EngineStats:
    """What an engine has computed so far (benchmarks/agent_throughput.py reads it)."""

    #: Forward passes that fed prompt tokens, and the seconds they took.
    prefill_passes: int = 0
    prefill_seconds: float = 0.0
    #: Prompt tokens fed (padding excluded), and prompt tokens a state already held.
    prefill_tokens: int = 0
    reused_tokens: int = 0
    #: Forward passes of one token per row, and the seconds they took.
    decode_passes: int = 0
    decode_seconds: float = 0.0
    #: Tokens chosen (every row's first token comes from its prefill pass).
    generated_tokens: int = 0


def unwrap(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


#: Layer kinds the engine decodes, with the cache layer transformers would give each: a full
#: one, and a sliding window the model masks itself (chunked layers share the class but not the
#: mask: their chunk borders would move with left padding).
ENGINE_LAYER_KINDS = {"full_attention": DynamicLayer, "sliding_attention": DynamicSlidingWindowLayer}
#: What `GrowingLayer` and `growing_cache` read or write on transformers' cache classes.
_LAYER_FIELDS = ("keys", "values", "is_initialized", "get_seq_length", "update", "get_mask_sizes")
_CACHE_FIELDS = ("layers", "layer_class_to_replicate")


def engine_support(model: Any) -> str | None:
    """None when the engine decodes `model` as `generate` would; otherwise why not, in a line.

    The engine keeps every layer's keys and values whole (`GrowingLayer`, a `DynamicLayer`), so
    every layer must be one of `ENGINE_LAYER_KINDS`, as transformers' `DynamicCache` would lay
    out the model's config (its `layer_types`, else `sliding_window` / `attention_chunk_size`):
    full attention, or a sliding window that the model's own mask applies (a config with a
    `sliding_window` size). No chunked, linear or shared layer. The model's forward must take
    `cache=`, and the cache classes must have the fields the engine writes. Reads the config and
    the classes only: no forward pass.
    """
    layer, cache = DynamicLayer(), DynamicCache()
    missing = [f"DynamicLayer.{f}" for f in _LAYER_FIELDS if not hasattr(layer, f)]
    missing += [f"DynamicCache.{f}" for f in _CACHE_FIELDS if not hasattr(cache, f)]
    if missing or getattr(layer, "is_sliding", False):
        return f"this transformers' cache classes lack what the engine uses ({', '.join(missing) or 'is_sliding'})"
    base = unwrap(model)
    if "cache" not in inspect.signature(base.forward).parameters:
        return f"{type(base).__name__}.forward takes no `cache` argument"
    config = base.config.get_text_config(decoder=True)
    try:
        layer_types, _ = get_layer_types_and_kwargs(config)
    except Exception as exc:  # a config transformers cannot lay out is not one the engine knows
        return f"cannot read the model's attention layout ({type(exc).__name__}: {exc})"
    other = sorted({t for t in layer_types
                     if t not in ENGINE_LAYER_KINDS or DYNAMIC_LAYER_TYPE_MAPPING.get(t) is not ENGINE_LAYER_KINDS[t]})
    if other:
        return f"not every layer is full or sliding-window attention ({', '.join(other)} layers in the model config)"
    if "sliding_attention" in layer_types and not isinstance(getattr(config, "sliding_window", None), int):
        return "sliding-window layers without a `sliding_window` size in the model config"
    return None


class Engine:
    """Greedy decoding for an HF causal LM over `KVState`s (one per sequence); ValueError for a
    model `engine_support` refuses."""

    def __init__(self, model: Any, tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        reason = engine_support(model)
        if reason is not None:
            raise ValueError(f"the KV engine cannot decode this model: {reason}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = tokenizer.pad_token_id
        self._logits_to_keep = "logits_to_keep" in inspect.signature(unwrap(model).forward).parameters
        self._prefixes: list[KVState] = []
        self.stats = EngineStats()
        #: Rows (indices into the current call's states) of the forward pass running now, so
        #: a forward hook can tell which sequence each batch row is; () for a shared prefix.
        self.active_rows: tuple[int, ...] = ()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def clear_prefixes(self) -> None:
        """Forget every shared prefix (call after the weights or the hooks change)."""
        self._prefixes = []

    # -- forward passes ------------------------------------------------------------------
    def _forward(self, rows: Sequence[int], states: Sequence[KVState], new: Sequence[Sequence[int]],
                 *, every_position: bool = False) -> _Batch:
        """Feed `new[j]` after `states[j]`: rows bring the same number of new tokens, or a
        fresh state is left-padded. The states then hold views into the batch's cache.
        `every_position`: the batch's logits are (rows, new tokens, vocab), not the last only."""
        width = max(s.length for s in states)
        held = sum(s.length for s in states)
        count = max(len(n) for n in new)
        device = self.device
        mask = torch.zeros(len(states), width + count, dtype=torch.long, device=device)
        ids = torch.full((len(states), count), self.pad_token_id, dtype=torch.long, device=device)
        for j, (state, tokens) in enumerate(zip(states, new)):
            mask[j, width - state.length : width] = 1
            mask[j, width + count - len(tokens) :] = 1
            ids[j, count - len(tokens) :] = torch.tensor(tokens, dtype=torch.long, device=device)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, width:]
        batch = _Batch(list(rows), _assemble(states, width), mask, None)  # type: ignore[arg-type]
        started = time.perf_counter()
        batch.logits = self._run(batch, ids, positions, every_position=every_position)
        self.stats.prefill_passes += 1
        self.stats.prefill_seconds += time.perf_counter() - started
        self.stats.prefill_tokens += sum(len(t) for t in new)
        self.stats.reused_tokens += held
        layers = _layers(batch.cache)
        for j, (state, tokens) in enumerate(zip(states, new)):
            total = state.length + len(tokens)
            state.tokens = [*state.tokens, *tokens]
            state.layers = _row(layers, j, total)
        return batch

    def _run(self, batch: _Batch, ids: torch.Tensor, positions: torch.Tensor, *,
             every_position: bool = False) -> torch.Tensor:
        """One forward pass of the model; the last position's logits, (rows, vocab), or with
        `every_position` every fed position's, (rows, positions, vocab)."""
        self.active_rows = tuple(batch.rows)
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep and not every_position else {}
        try:
            output = self.model(
                input_ids=ids, attention_mask=batch.mask, position_ids=positions, cache=batch.cache,
                use_cache=True, **kwargs,
            )
        finally:
            self.active_rows = ()
        return output.logits.float() if every_position else output.logits[:, -1, :].float()

    # -- prefill -------------------------------------------------------------------------
    def _reuse(self, states: Sequence[KVState], prompts: Sequence[Sequence[int]], share: bool) -> None:
        """Crop each state to its common prefix with its prompt (keeping one token to feed);
        a fresh state starts from the best shared prefix."""
        fresh = []
        for i, (state, prompt) in enumerate(zip(states, prompts)):
            if state.length == 0 and share:
                fresh.append(i)
            state.crop(min(common_prefix(state.tokens, prompt), len(prompt) - 1))
        if not fresh:
            return
        shared = [prompts[i] for i in fresh]
        if len(shared) > 1:
            n = min(min(common_prefix(shared[0], p) for p in shared[1:]), min(len(p) for p in shared) - 1)
            if n >= MIN_SHARED_PREFIX and not any(common_prefix(p.tokens, shared[0]) >= n for p in self._prefixes):
                prefix = KVState()
                self._forward((), [prefix], [list(shared[0][:n])])  # a batch of one: its own tensors
                self._prefixes.insert(0, prefix)
                del self._prefixes[MAX_SHARED_PREFIXES:]
        for i in fresh:
            best, length = None, 0
            for prefix in self._prefixes:
                n = min(common_prefix(prefix.tokens, prompts[i]), len(prompts[i]) - 1)
                if n > length:
                    best, length = prefix, n
            if best is not None and length >= MIN_SHARED_PREFIX:
                states[i]._adopt(best, length)
                self._prefixes.remove(best)
                self._prefixes.insert(0, best)

    @staticmethod
    def _groups(pending: Sequence[int]) -> list[list[int]]:
        """Rows grouped for prefill: a row whose new tokens are fewer than half the group's
        longest starts a new group, so short rows do not pad up to a long one."""
        order = sorted(range(len(pending)), key=lambda i: -pending[i])
        groups: list[list[int]] = []
        for i in order:
            if groups and 2 * pending[i] >= pending[groups[-1][0]]:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def _prefill(self, states: Sequence[KVState], prompts: Sequence[Sequence[int]], share: bool) -> _Batch:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("the engine cannot prefill an empty prompt")
        self._reuse(states, prompts, share)
        batches = self._feed(list(range(len(states))), states, prompts)
        if len(batches) == 1:
            return batches[0]
        rows = [i for b in batches for i in b.rows]
        width = max(states[i].length for i in rows)
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for j, i in enumerate(rows):
            mask[j, width - states[i].length :] = 1
        logits = torch.cat([b.logits for b in batches])
        return _Batch(rows, _assemble([states[i] for i in rows], width), mask, logits)

    def _feed(self, rows: Sequence[int], states: Sequence[KVState], sequences: Sequence[Sequence[int]], *,
              every_position: bool = False) -> list[_Batch]:
        """Make `states[j]` hold `sequences[j]` (it holds a prefix of it), in groups of rows
        with alike numbers of new tokens; `rows[j]` is the row index a forward hook sees."""
        pending = [len(q) - s.length for s, q in zip(states, sequences)]
        batches = []
        for group in self._groups(pending):
            count = max(pending[j] for j in group)
            for j in group:  # re-feed cached tokens so every row brings `count` new ones
                states[j].crop(max(0, len(sequences[j]) - count))
            batches.append(self._forward(
                [rows[j] for j in group], [states[j] for j in group],
                [sequences[j][states[j].length :] for j in group], every_position=every_position,
            ))
        return batches

    def prefill(
        self, states: Sequence[KVState], prompts: Sequence[Sequence[int]], *, share_prefixes: bool = True
    ) -> torch.Tensor:
        """Make each state hold its prompt; return the next-token logits, (rows, vocab).

        Each state keeps its longest common prefix with its prompt and computes only the rest
        (at least the last token, whose logits are needed). `share_prefixes` lets fresh states
        start from a prefix shared with other prompts; turn it off when a forward hook treats
        sequences differently.
        """
        with torch.inference_mode():
            batch = self._prefill(states, prompts, share_prefixes)
        order = {i: j for j, i in enumerate(batch.rows)}
        return batch.logits[[order[i] for i in range(len(states))]]

    # -- teacher-forced scoring -----------------------------------------------------------
    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *,
        share_prefixes: bool = True, batch_size: int | None = None,
    ) -> list[list[float]]:
        """Log-probability of each continuation token after its prompt, one row per pair.

        Each distinct prompt is prefilled once (row: the first pair that has it, for a forward
        hook); its pairs then feed their continuations over views of its cache. Pass
        `share_prefixes=False` when a forward hook treats sequences differently.
        """
        if len(prompts) != len(continuations):
            raise ValueError("one continuation per prompt")
        if any(len(p) == 0 for p in prompts) or any(len(c) == 0 for c in continuations):
            raise ValueError("the engine cannot score an empty prompt or continuation")
        scores: list[list[float]] = [[] for _ in prompts]
        size = batch_size or len(prompts)
        with torch.inference_mode():
            for start in range(0, len(prompts), size):
                rows = list(range(start, min(start + size, len(prompts))))
                self._score_rows(rows, prompts, continuations, share_prefixes, scores)
        return scores

    def _score_rows(self, rows: list[int], prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                    share: bool, scores: list[list[float]]) -> None:
        first: dict[tuple[int, ...], int] = {}
        for i in rows:
            first.setdefault(tuple(prompts[i]), i)
        heads = list(first.values())  # each distinct prompt, as the first pair that has it
        held = [KVState() for _ in heads]
        cut = [list(prompts[i][:-1]) or list(prompts[i]) for i in heads]
        self._reuse(held, cut, share)  # a state keeps at least one token of its prompt to feed
        self._feed(heads, held, cut)
        prompt_state = {tuple(prompts[i]): s for i, s in zip(heads, held)}
        states, sequences = [], []
        for i in rows:
            state, prompt = KVState(), list(prompts[i])
            # the prompt's last token predicts the first continuation token: it is fed again
            state._adopt(prompt_state[tuple(prompt)], len(prompt) - 1)
            states.append(state)
            sequences.append(prompt + list(continuations[i][:-1]))
        for batch in self._feed(rows, states, sequences, every_position=True):
            width = batch.logits.shape[1]
            for j, i in enumerate(batch.rows):
                n = len(continuations[i])
                logits = batch.logits[j, width - n :]
                targets = torch.tensor(continuations[i], device=logits.device)
                scores[i] = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0].tolist()

    # -- decode --------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        states: Sequence[KVState],
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        share_prefixes: bool = True,
        on_logits: Callable[[int, torch.Tensor], None] | None = None,
        choose: Callable[[int, torch.Tensor], int] | None = None,
    ) -> list[list[int]]:
        """Greedy continuations (token ids, end-of-turn token excluded) of each prompt.

        A row ends at an end-of-turn token, at `max_new_tokens`, or at the token that
        completes a `stop` string (checked on the last few decoded tokens only). Afterwards
        each state holds its prompt and every generated token but the last. `on_logits(row,
        logits)` sees each row's next-token logits before each choice.
        """
        if not states:
            return []
        batch = self._prefill(states, prompts, share_prefixes)
        tail = max((len(self.tokenizer.encode(s, add_special_tokens=False)) for s in stop), default=0) + 2
        outputs: list[list[int]] = [[] for _ in states]
        while batch.rows:
            keep: list[int] = []
            for j, i in enumerate(batch.rows):
                if on_logits is not None:
                    on_logits(i, batch.logits[j])
                token = int(batch.logits[j].argmax()) if choose is None else choose(i, batch.logits[j])
                self.stats.generated_tokens += 1
                end_of_turn = token in self.eos_token_ids
                ended = end_of_turn
                if not end_of_turn:
                    outputs[i].append(token)
                    ended = len(outputs[i]) >= max_new_tokens or bool(stop and self._stopped(outputs[i][-tail:], stop))
                if ended:  # the state keeps what was fed: the prompt and every output token but a new one
                    fed = len(prompts[i]) + len(outputs[i]) - (0 if end_of_turn else 1)
                    states[i].tokens = [*prompts[i], *outputs[i]][:fed]
                    states[i].layers = _copy(_row(_layers(batch.cache), j, fed))
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(batch.rows):
                batch = batch.select(keep)
            ids = torch.tensor([[outputs[i][-1]] for i in batch.rows], dtype=torch.long, device=self.device)
            positions = batch.mask.sum(-1, keepdim=True)
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)
            started = time.perf_counter()
            batch.logits = self._run(batch, ids, positions)
            self.stats.decode_passes += 1
            self.stats.decode_seconds += time.perf_counter() - started
        return outputs

    def _stopped(self, tokens: Sequence[int], stop: Sequence[str]) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(s in text for s in stop)


@dataclass
class _Batch:
    """Sequences decoded together: a left-padded batch cache and its attention mask."""

    #: The state index of each batch row.
    rows: list[int]
    cache: DynamicCache
    #: (rows, cache width): 1 over each row's tokens, 0 over its left padding.
    mask: torch.Tensor
    #: (rows, vocab): each row's next-token logits.
    logits: torch.Tensor

    def select(self, keep: Sequence[int]) -> _Batch:
        """The batch with only rows `keep` (copies those rows' cache once)."""
        index = torch.tensor(keep, device=self.mask.device)
        cache = growing_cache()
        cache.layers = [layer.take(index) for layer in self.cache.layers]
        return _Batch([self.rows[j] for j in keep], cache, self.mask[index], self.logits[index])


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are the first columns of buffers with spare ones.

    `DynamicLayer` concatenates at every forward pass, a copy of the whole cache per decoded
    token (its cost: BENCHMARKS.md, `decode_cache.py`). This layer
    writes the new columns into the spare ones and hands attention views of the same shape
    and values, so every logit is the same bit for bit. Columns a view was handed out for are
    never written again; a layer whose keys were replaced or cropped reallocates instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        #: Columns handed out as `keys`/`values`: the next write starts here.
        self.held = 0

    def hold(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Adopt buffers (batch, heads, capacity, head dim) whose first `length` columns are the cache."""
        self.device, self.is_initialized = keys.device, True
        self.key_buffer, self.value_buffer = keys, values
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        self.held = length

    def _intact(self) -> bool:
        """Are the keys still the buffer's first `held` columns (not replaced or cropped)?"""
        return (self.key_buffer is not None and self.keys.data_ptr() == self.key_buffer.data_ptr()
                and self.keys.shape[2] == self.held)

    def take(self, index: torch.Tensor) -> GrowingLayer:
        """A layer of the batch rows `index`: one copy of their buffers, spare columns included."""
        layer = GrowingLayer()
        if self._intact():
            layer.hold(self.key_buffer.index_select(0, index), self.value_buffer.index_select(0, index), self.held)
        elif self.is_initialized:
            layer.update(self.keys.index_select(0, index), self.values.index_select(0, index))
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.get_seq_length()
        total = length + key_states.shape[2]
        intact = (self._intact() and self.keys.shape[0] == key_states.shape[0]
                  and total <= self.key_buffer.shape[2])
        if not intact:
            rows = key_states.shape[0]
            keys, values = _buffer(key_states, rows, total), _buffer(value_states, rows, total)
            if length:
                keys[:, :, :length] = self.keys
                values[:, :, :length] = self.values
            self.hold(keys, values, length)
        self.key_buffer[:, :, length:total] = key_states
        self.value_buffer[:, :, length:total] = value_states
        self.keys, self.values = self.key_buffer[:, :, :total], self.value_buffer[:, :, :total]
        self.held = total
        return self.keys, self.values


def _buffer(like: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Room (uninitialized) for `rows` sequences of `length` columns plus `SPARE_COLUMNS`, in
    `like`'s heads, head dim and dtype: every column is written before attention reads it."""
    return like.new_empty((rows, like.shape[1], length + SPARE_COLUMNS, like.shape[3]))


def growing_cache() -> DynamicCache:
    """An empty cache whose layers are `GrowingLayer`s (the engine's batch caches)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


def _assemble(states: Sequence[KVState], width: int) -> DynamicCache:
    """One left-padded batch cache of `width` columns (and spare ones) from per-sequence states."""
    cache = growing_cache()
    if width == 0:
        return cache
    template = next(s.layers for s in states if s.length)
    for index, (k0, v0) in enumerate(template):
        keys, values = _buffer(k0, len(states), width), _buffer(v0, len(states), width)
        for j, state in enumerate(states):
            pad = width - state.length  # masked out, but it must hold finite values for attention
            keys[j, :, :pad] = 0
            values[j, :, :pad] = 0
            if state.length:
                k, v = state.layers[index]
                keys[j, :, width - state.length : width] = k[0]
                values[j, :, width - state.length : width] = v[0]
        layer = GrowingLayer()
        layer.hold(keys, values, width)
        cache.layers.append(layer)
    return cache


def _layers(cache: Any) -> Layers:
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _row(layers: Layers, j: int, length: int) -> Layers:
    """Batch row `j`'s last `length` columns, per layer (views)."""
    return tuple((k[j : j + 1, :, -length:], v[j : j + 1, :, -length:]) for k, v in layers)


def _copy(layers: Layers) -> Layers:
    """Tensors of their own, so that a large batch cache they were cut from can be freed."""
    return tuple((k.clone(), v.clone()) for k, v in layers)
