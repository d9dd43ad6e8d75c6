"""Run the probes' items through one deployed model: teacher-forced log-probabilities and
greedy continuations, through the KV engine (`Engine.score`, `Engine.generate`; for a model
the engine cannot hold, row by row through plain forward passes and `generate`), with the
method's input and forward hooks on, as the agent would have them (no output hook: a probe
reads no thought to filter). The raw rows go to `kbench.probes.summary` (pure scores)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from kbench.backends.hf import HFBackend, encode_prompt, end_of_turn_ids
from kbench.config import ProbesConfig
from kbench.methods import Method
from kbench.observer.matcher import match
from kbench.probes.items import HELDOUT, ProbeItems, ProbeQuestion
from kbench.records import FORGET, Query

#: Digits kept of a raw log-probability. A forward pass's low bits follow the thread count and
#: the CPU's kernels (about 1e-5 here); the stage runs every model on one thread, and rounding
#: keeps the rest out of the bytes on all but rare ties (docs/probes.md).
DIGITS = 4


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(v, DIGITS) for v in values]


class ProbeRunner:
    """One deployed model (backend + method) under its hooks."""

    def __init__(self, backend: HFBackend, method: Method, config: ProbesConfig) -> None:
        self.backend, self.method, self.config = backend, method, config
        hooks = method.hooks
        self.share = "forward" not in hooks or method.uniform_forward

    def _hooks(self, queries: Sequence[Query]) -> contextlib.AbstractContextManager:
        if "forward" in self.method.hooks:
            return self.method.forward_hooks(self.backend, list(queries))
        return contextlib.nullcontext()

    def _prompt(self, query: Query, chat: list[dict]) -> list[int]:
        if "input" in self.method.hooks:
            chat = self.method.rewrite_input(query, chat)
        return encode_prompt(self.backend.tokenizer, chat)

    def _tokens(self, text: str) -> list[int]:
        return self.backend.tokenizer.encode(text, add_special_tokens=False)

    def score(self, rows: Sequence[tuple[Query, list[dict], str, str]]) -> list[list[float]]:
        """Token log-probabilities of each (query, chat, assistant prefix, text) row's text,
        after the chat and the prefix."""
        queries = [q for q, _, _, _ in rows]
        prompts = [self._prompt(q, chat) + (self._tokens(prefix) if prefix else []) for q, chat, prefix, _ in rows]
        answers = [self._tokens(f" {text}" if prefix else text) for _, _, prefix, text in rows]
        if self.backend.session() is None:  # no KV engine for this model (chunked or linear layers)
            return [self._score_alone(q, prompt, answer) for q, prompt, answer in zip(queries, prompts, answers)]
        engine = self.backend.engine
        engine.clear_prefixes()
        with self._hooks(queries):
            return engine.score(prompts, answers, share_prefixes=self.share, batch_size=self.config.batch_size)

    def _score_alone(self, query: Query, prompt: list[int], answer: list[int]) -> list[float]:
        """One row's log-probabilities in one plain forward pass (its hooks see a batch of one)."""
        model = self.backend.model
        ids = torch.tensor([prompt + answer], device=next(model.parameters()).device)
        with self._hooks([query]), torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        chosen = torch.tensor(answer, device=logits.device)[:, None]
        return torch.log_softmax(logits, dim=-1).gather(1, chosen)[:, 0].tolist()

    def generate(self, rows: Sequence[tuple[Query, list[dict], str]]) -> list[str]:
        """Greedy continuations of each (query, chat, assistant prefix) row, `batch_size` rows
        at a time (a forward hook sees the rows of its own call)."""
        prompts = [self._prompt(q, chat) + (self._tokens(prefix) if prefix else []) for q, chat, prefix in rows]
        tokenizer = self.backend.tokenizer
        if self.backend.session() is None:  # no KV engine for this model: transformers' generate, row by row
            eos = end_of_turn_ids(self.backend.model, tokenizer)
            return [tokenizer.decode(self._generate_alone(q, prompt, eos), skip_special_tokens=True)
                    for (q, _, _), prompt in zip(rows, prompts)]
        engine = self.backend.engine
        texts: list[str] = []
        size = self.config.batch_size
        for start in range(0, len(rows), size):
            chunk = range(start, min(start + size, len(rows)))
            engine.clear_prefixes()
            with self._hooks([rows[i][0] for i in chunk]):
                outputs = engine.generate([self.backend.session() for _ in chunk], [prompts[i] for i in chunk],
                                          max_new_tokens=self.config.max_new_tokens, share_prefixes=self.share)
            texts += [tokenizer.decode(o, skip_special_tokens=True) for o in outputs]
        return texts

    def _generate_alone(self, query: Query, prompt: list[int], eos: list[int]) -> list[int]:
        """One row's greedy continuation by `generate`, ending at an `eos` id (excluded, as the engine's)."""
        model = self.backend.model
        ids = torch.tensor([prompt], device=next(model.parameters()).device)
        pad = self.backend.tokenizer.pad_token_id
        with self._hooks([query]), torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=self.config.max_new_tokens, eos_token_id=eos,
                                 pad_token_id=eos[0] if pad is None else pad)
        return [t for t in out[0, len(prompt):].tolist() if t not in eos]


def _question_rows(items: Sequence[ProbeQuestion]) -> list[tuple[Query, list[dict], str, str]]:
    return [(q.query, q.prompt, stem, text) for q in items for stem, text in q.candidates()]


def _split_scores(items: Sequence[ProbeQuestion], scores: list[list[float]]) -> list[dict[str, Any]]:
    rows, at = [], 0
    for q in items:
        width = 1 + len(q.perturbed)
        answer, *perturbed = scores[at : at + width]
        at += width
        rows.append({
            "query_id": q.query.query_id, "group": q.group, "field": q.query.field,
            "answer": _rounded(answer), "perturbed": [_rounded(p) for p in perturbed],
        })
    return rows


def run_probes(runner: ProbeRunner, items: ProbeItems) -> dict[str, list[dict[str, Any]]]:
    """Every probe's raw rows on one model: per question (scores, greedy reply, exact match),
    per bio (its token log-probabilities for Min-K%; a continuation of the queried entities'
    bios for VerbMem) and per general fact (scores). One scoring pass and one decoding pass."""
    questions, bios, general = items.questions, items.bios, items.general
    scored = [b for b in bios if b.group in (FORGET, HELDOUT)]  # Min-K%: members and non-members
    continued = [b for b in bios if b.group != HELDOUT and b.rest]  # VerbMem
    question_rows, general_rows = _question_rows(questions), _question_rows(general)
    scores = runner.score(question_rows + general_rows + [(b.query, b.prompt, "", b.text) for b in scored])
    n_q, n_g = len(question_rows), len(general_rows)
    question_out = _split_scores(questions, scores[:n_q])
    general_out = _split_scores(general, scores[n_q : n_q + n_g])
    replies = runner.generate(
        [(q.query, q.prompt, "") for q in questions] + [(b.query, b.prompt, b.prefix) for b in continued]
    )
    for row, q, reply in zip(question_out, questions, replies):
        row["reply"] = reply
        row["value"] = q.value
        row["exact_match"] = match(q.query.field, q.value, reply).leaked
    bio_out = [
        {"entity_id": b.query.entity_id, "group": b.group, "logprobs": _rounded(logprobs)}
        for b, logprobs in zip(scored, scores[n_q + n_g :])
    ]
    bio_out += [
        {"entity_id": b.query.entity_id, "group": b.group, "rest": b.rest, "continuation": reply}
        for b, reply in zip(continued, replies[len(questions) :])
    ]
    return {"questions": question_out, "bios": bio_out, "general": general_out}
