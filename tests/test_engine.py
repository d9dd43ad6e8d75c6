"""The KV engine (kbench.backends.engine): exact cache reuse, crop and checkpoint, batching, hooks.

On a tiny random Llama in float64, every logit the engine computes from a cache equals a full
recompute's within 1e-9; its greedy tokens equal transformers' `generate` on the whole prompt.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from kbench.backends.engine import (
    MIN_SHARED_PREFIX, Engine, GrowingLayer, KVState, _assemble, common_prefix, growing_cache,
)
from kbench.backends.hf import encode_prompt, end_of_turn_ids, load_model, reference_decode
from kbench.config import ModelConfig

SYSTEM = "You answer questions about people: their date of birth, home address, occupation and employer."
QUESTIONS = ["What is it?", "What is the home address of a person called Ann?", "Who?", "What is the occupation?"]


def chat(question: str, *turns: str) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question: {question}"}]
    for i, text in enumerate(turns):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    return messages


@pytest.fixture(scope="module")
def tiny64(tiny_model_dir, device):  # noqa: F811
    model, tokenizer = load_model(ModelConfig(path=str(tiny_model_dir), device=device))
    model = model.double()
    return model, tokenizer, Engine(model, tokenizer, end_of_turn_ids(model, tokenizer))


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].float()


def test_cached_logits_equal_a_full_recompute_at_every_step(tiny64):
    model, tokenizer, engine = tiny64
    engine.clear_prefixes()
    states = [KVState() for _ in QUESTIONS]
    conversations = [chat(q) for q in QUESTIONS]
    for step in range(3):
        prompts = [encode_prompt(tokenizer, c) for c in conversations]
        seen: dict[int, list[torch.Tensor]] = {}
        outputs = engine.generate(states, prompts, max_new_tokens=6,
                                  on_logits=lambda row, logits: seen.setdefault(row, []).append(logits))
        for row, (prompt, output) in enumerate(zip(prompts, outputs)):
            sequence = list(prompt)
            for logits, token in zip(seen[row], [*output, None]):
                assert torch.allclose(logits, full_logits(model, sequence), atol=1e-9, rtol=0)
                if token is not None:
                    sequence.append(token)
            # The state holds the prompt and every generated token but the last.
            assert states[row].tokens == (prompt + output)[: states[row].length]
            assert states[row].length >= len(prompt)
        # The next prompt: the reply as an assistant turn and an observation turn.
        conversations = [
            c + [{"role": "assistant", "content": tokenizer.decode(o, skip_special_tokens=True).strip() or "x"},
                 {"role": "user", "content": f"Observation: result {step} {row}"}]
            for row, (c, o) in enumerate(zip(conversations, outputs))
        ]


def test_greedy_tokens_equal_generate_on_the_whole_prompt(tiny64, tiny_model_dir):  # noqa: F811
    model, tokenizer, engine = tiny64
    conversations = [chat(q) for q in QUESTIONS]
    eos = end_of_turn_ids(model, tokenizer)
    reference = reference_decode(model, tokenizer, conversations, max_new_tokens=10, eos_token_ids=eos)
    states = [KVState() for _ in conversations]
    outputs = engine.generate(states, [encode_prompt(tokenizer, c) for c in conversations], max_new_tokens=10)
    assert [tokenizer.decode(o, skip_special_tokens=True) for o in outputs] == reference


def test_batched_rows_of_different_lengths_equal_each_row_alone(tiny64):
    model, tokenizer, engine = tiny64
    # Rows with caches of different lengths and different numbers of new tokens.
    prompts = [encode_prompt(tokenizer, chat(q, "Thought: a", "Observation: " + "b " * (3 * i)))
               for i, q in enumerate(QUESTIONS)]
    warm = [encode_prompt(tokenizer, chat(q)) for q in QUESTIONS]

    def run(rows):
        engine.clear_prefixes()
        states = [KVState() for _ in rows]
        engine.prefill(states, [warm[i] for i in rows], share_prefixes=False)
        return engine.generate(states, [prompts[i] for i in rows], max_new_tokens=8, share_prefixes=False)

    batched = run(range(len(QUESTIONS)))
    assert batched == [run([i])[0] for i in range(len(QUESTIONS))]


def test_crop_and_restore_reproduce_the_continuation_token_for_token(tiny64):
    model, tokenizer, engine = tiny64
    prompt = encode_prompt(tokenizer, chat(QUESTIONS[1]))
    state = KVState()
    engine.prefill([state], [prompt])
    checkpoint = state.checkpoint()
    keys = state.layers[0][0]
    (first,) = engine.generate([state], [prompt], max_new_tokens=12)
    assert state.layers[0][0] is not keys and checkpoint.layers[0][0] is keys  # nothing overwritten
    state.restore(checkpoint)
    assert engine.generate([state], [prompt], max_new_tokens=12) == [first]
    # Crop into the prompt and regenerate: the same continuation again.
    state.crop(len(prompt) // 2)
    assert state.length == len(prompt) // 2 and state.layers[0][0].shape[2] == len(prompt) // 2
    assert engine.generate([state], [prompt], max_new_tokens=12) == [first]


def test_hooks_fire_on_cached_steps_and_see_which_rows_run(tiny64):
    model, tokenizer, engine = tiny64
    engine.clear_prefixes()
    calls: list[tuple[int, tuple[int, ...]]] = []
    handle = model.model.layers[0].register_forward_hook(
        lambda module, args, output: calls.append((args[0].shape[1], engine.active_rows)))
    try:
        states = [KVState(), KVState()]
        prompts = [encode_prompt(tokenizer, chat(q)) for q in QUESTIONS[:2]]
        engine.prefill(states, prompts, share_prefixes=False)
        calls.clear()
        longer = [p + encode_prompt(tokenizer, [{"role": "user", "content": "Observation: x"}]) for p in prompts]
        engine.generate(states, longer, max_new_tokens=3, share_prefixes=False)
    finally:
        handle.remove()
    new_tokens = len(longer[0]) - len(prompts[0])
    assert calls[0][0] == new_tokens  # the cached prompt is not fed again, only the new tokens
    assert all(rows for _, rows in calls) and set(calls[0][1]) == {0, 1}
    assert len(calls) > 1 and all(width == 1 for width, _ in calls[1:])  # decode steps


def test_shared_prefix_is_prefilled_once_and_reused(tiny64):
    model, tokenizer, engine = tiny64
    engine.clear_prefixes()
    prompts = [encode_prompt(tokenizer, chat(q)) for q in QUESTIONS]
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared >= MIN_SHARED_PREFIX
    states = [KVState() for _ in prompts]
    together = engine.generate(states, prompts, max_new_tokens=6)
    assert len(engine._prefixes) == 1 and engine._prefixes[0].length == shared
    # A later fresh state starts from the stored prefix (a view: no copy) and decodes the same.
    late = KVState()
    assert engine.generate([late], [prompts[2]], max_new_tokens=6) == [together[2]]
    alone = Engine(model, tokenizer, end_of_turn_ids(model, tokenizer))
    assert alone.generate([KVState()], [prompts[2]], max_new_tokens=6, share_prefixes=False) == [together[2]]


def test_a_fresh_prompt_sharing_part_of_a_stored_prefix_decodes_as_alone(tiny64):
    model, tokenizer, engine = tiny64
    engine.clear_prefixes()
    prompts = [encode_prompt(tokenizer, chat(q)) for q in QUESTIONS]
    engine.generate([KVState() for _ in prompts], prompts, max_new_tokens=4)
    (stored,) = engine._prefixes
    # Same system prompt, another wording after it: it shares only part of the stored prefix.
    other = encode_prompt(tokenizer, [{"role": "system", "content": SYSTEM + " Be brief."},
                                      {"role": "user", "content": "Question: Who?"}])
    shared = common_prefix(stored.tokens, other)
    assert MIN_SHARED_PREFIX <= shared < stored.length
    late = KVState()
    (output,) = engine.generate([late], [other], max_new_tokens=6)
    alone = Engine(model, tokenizer, end_of_turn_ids(model, tokenizer))
    assert alone.generate([KVState()], [other], max_new_tokens=6, share_prefixes=False) == [output]
    assert all(k.shape[2] == late.length for k, _ in late.layers)


def test_stop_strings_end_a_row_where_generate_would(tiny64):
    model, tokenizer, engine = tiny64
    conversation = chat(QUESTIONS[0])
    eos = end_of_turn_ids(model, tokenizer)
    (full,) = reference_decode(model, tokenizer, [conversation], max_new_tokens=20, eos_token_ids=eos)
    assert len(full) > 4
    marker = full[2:5]
    (reference,) = reference_decode(model, tokenizer, [conversation], max_new_tokens=20, stop=[marker], eos_token_ids=eos)
    (output,) = engine.generate([KVState()], [encode_prompt(tokenizer, conversation)], max_new_tokens=20, stop=[marker])
    text = tokenizer.decode(output, skip_special_tokens=True)
    assert marker in text and text[: text.find(marker)] == reference


def test_empty_prompt_is_refused(tiny64):
    _, _, engine = tiny64
    with pytest.raises(ValueError, match="empty prompt"):
        engine.prefill([KVState()], [[]])


def test_score_equals_a_full_recompute_for_every_pair(tiny64):
    """Teacher-forced log-probabilities of continuations (shared prompts prefilled once, uneven
    continuation lengths, batched) equal a full forward pass over prompt + continuation."""
    model, tokenizer, engine = tiny64
    engine.clear_prefixes()
    prompts = [encode_prompt(tokenizer, chat(q)) for q in QUESTIONS[:3]]
    answers = ["It is 1983-07-14.", "12 Main Street, Springfield", "x", "A civil engineer at Meridian Infrastructure."]
    pairs = [(p, tokenizer.encode(a, add_special_tokens=False)) for p in prompts for a in answers]
    for share, batch_size in ((True, None), (False, 5)):
        scores = engine.score([p for p, _ in pairs], [c for _, c in pairs], share_prefixes=share, batch_size=batch_size)
        for (prompt, continuation), got in zip(pairs, scores):
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + continuation], device=model.device)).logits[0].float()
            logprobs = torch.log_softmax(logits, -1)
            want = [float(logprobs[len(prompt) - 1 + k, t]) for k, t in enumerate(continuation)]
            assert len(got) == len(continuation)
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6  # float32 logits, as the engine returns


def test_score_refuses_an_empty_continuation(tiny64):
    _, tokenizer, engine = tiny64
    with pytest.raises(ValueError, match="empty"):
        engine.score([encode_prompt(tokenizer, chat("Who?"))], [[]])


def _decode_logits(model, cache, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill `ids` into `cache`, then decode greedily; every step's logits and the key buffer's address."""
    logits, addresses = [], []
    with torch.inference_mode():
        out = model(input_ids=ids, cache=cache, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1:].argmax(-1)
            logits.append(out.logits[:, -1])
            layer = cache.layers[0]
            addresses.append((layer.key_buffer if isinstance(layer, GrowingLayer) else layer.keys).data_ptr())
            out = model(input_ids=token, cache=cache, use_cache=True)
    return torch.stack(logits), addresses


def test_growing_layer_gives_the_concatenating_cache_s_logits_bit_for_bit_without_copies(tiny_model_dir, device):  # noqa: F811
    model, tokenizer = load_model(ModelConfig(path=str(tiny_model_dir), device=device))  # float32, as the runs
    ids = torch.tensor([encode_prompt(tokenizer, chat(q))[:12] for q in QUESTIONS], device=model.device)
    reference, _ = _decode_logits(model, DynamicCache(), ids, 20)
    growing = growing_cache()
    logits, addresses = _decode_logits(model, growing, ids, 20)
    assert torch.equal(logits, reference)
    assert isinstance(growing.layers[0], GrowingLayer)
    assert len(set(addresses)) == 1  # every decoded column went into the same buffer


def test_growing_layer_never_writes_a_column_it_handed_out():
    layer = GrowingLayer()
    keys = torch.arange(24.0).reshape(1, 1, 6, 4)
    layer.update(keys, keys.clone())
    handed = layer.keys
    layer.crop(-2)  # a cropped layer must not write its next columns over the view handed out
    layer.update(torch.full((1, 1, 1, 4), -1.0), torch.full((1, 1, 1, 4), -1.0))
    assert torch.equal(handed, keys)
    assert torch.equal(layer.keys[:, :, :4], keys[:, :, :4]) and layer.keys[0, 0, 4].eq(-1).all()
    before = layer.key_buffer.data_ptr()
    layer.update(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))  # an intact layer writes in place
    assert layer.key_buffer.data_ptr() == before and layer.keys.shape[2] == 8


def test_taking_rows_copies_their_columns_and_keeps_the_spare_room():
    layer = GrowingLayer()
    keys = torch.arange(48.0).reshape(3, 1, 4, 4)
    layer.update(keys, -keys)
    index = torch.tensor([2, 0])
    taken = layer.take(index)
    assert torch.equal(taken.keys, keys[[2, 0]]) and torch.equal(taken.values, -keys[[2, 0]])
    assert taken.key_buffer.data_ptr() != layer.key_buffer.data_ptr()
    before = taken.key_buffer.data_ptr()
    taken.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))  # the next column goes into the spare room
    assert taken.key_buffer.data_ptr() == before and torch.equal(taken.keys[:, :, :4], keys[[2, 0]])
    layer.crop(-1)  # a cropped layer is copied from its keys, not from its buffer
    assert torch.equal(layer.take(index).keys, keys[[2, 0], :, :3])


def test_an_assembled_batch_cache_has_zeros_in_its_left_padding(monkeypatch):
    # Buffers start uninitialized; fill them with NaN to see that assembly writes every column
    # attention reads (NaN in masked padding would still poison softmax).
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, size: torch.full(size, float("nan")))
    short = KVState([1, 2], ((torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4)),))
    long = KVState([1, 2, 3, 4, 5], ((torch.ones(1, 1, 5, 4), torch.ones(1, 1, 5, 4)),))
    cache = _assemble([short, long], 5)
    layer = cache.layers[0]
    assert torch.equal(layer.keys[0, :, :3], torch.zeros(1, 3, 4)) and torch.equal(layer.values[0, :, :3], torch.zeros(1, 3, 4))
    assert not layer.keys.isnan().any() and not layer.values.isnan().any() and layer.keys.shape[2] == 5
