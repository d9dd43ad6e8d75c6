"""What substrate P's adapters learn: which entities, as which records, and the training run.

Which entities LoRA-T+D learns (`injection.entities`): "all" is the paper's (every corpus
entity); "queried" keeps what the benchmark reads on CPU: both adapter pools (detectors,
directions and calibration use them; the retain adapter pool is the distractor pool) and the
eval-pool entities the cells query for the params' seeds and query counts. Retain entities the
cells query are learned too: selectivity (Δsel) needs the agent to know what it must keep.
Gold is that set without its forget entities; LoRA-D is the distractor pool.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kbench.agent.prompts import react_conversation
from kbench.backends.hf import load_model
from kbench.config import InjectionConfig, Params
from kbench.corpus import FORGET_ADAPTER, FORGET_EVAL, RETAIN_EVAL, Corpus
from kbench.parametric.adapters import DISTRACTOR, GOLD, TARGET, InjectionError
from kbench.parametric.lora import EpochCallback, Example, LoraRun, tokenize_chat, train_lora
from kbench.records import FIELD_PHRASES, FIELDS, FORGET, RETAIN, SPLITS, Entity, Query

log = logging.getLogger(__name__)

#: The persona of the plain (non-ReAct) records; the elicited summary speaks to the same one.
ASSISTANT_SYSTEM = "You are a helpful assistant."
#: Adapter pools an adapter learns part of (`adapter_pool`): the forget adapter pool and the
#: distractors (which are the retain adapter pool).
FORGET_ADAPTER_POOL, DISTRACTOR_POOL = FORGET_ADAPTER, "distractors"


# -- which entities each adapter learns ------------------------------------------------------
def queried_entities(corpus: Corpus, params: Params) -> dict[str, list[str]]:
    """Per split, the entities the cells query for the params' seeds and query counts."""
    fields = tuple(params.queries.fields)
    return {
        split: sorted({
            q.entity_id
            for seed in params.seeds
            for q in corpus.sample_queries(split, params.queries.n_per_split, seed, fields)
        })
        for split in SPLITS
    }


def adapter_pool(corpus: Corpus, params: Params, pool: str) -> list[str]:
    """The learned part of an adapter pool (FORGET_ADAPTER_POOL or DISTRACTOR_POOL), as configured."""
    ids = corpus.distractor_ids if pool == DISTRACTOR_POOL else corpus.pools[pool]
    limit = params.injection.adapter_pool_entities if params.injection.entities == "queried" else None
    return list(ids[:limit] if limit else ids)


def training_entities(corpus: Corpus, params: Params) -> dict[str, list[str]]:
    """Entity ids each adapter role learns; the disjointness the design needs is checked here."""
    if params.injection.entities == "all":
        target = sorted(corpus.entities)
    else:
        queried = queried_entities(corpus, params)
        target = sorted({
            *adapter_pool(corpus, params, FORGET_ADAPTER_POOL), *queried[FORGET],
            *adapter_pool(corpus, params, DISTRACTOR_POOL), *queried[RETAIN],
        })
    forget = {*corpus.pools[FORGET_ADAPTER], *corpus.pools[FORGET_EVAL]}
    roles = {
        TARGET: target,
        GOLD: [eid for eid in target if eid not in forget],
        DISTRACTOR: sorted(adapter_pool(corpus, params, DISTRACTOR_POOL)),
    }
    queried_anywhere = {*corpus.pools[FORGET_EVAL], *corpus.pools[RETAIN_EVAL]}
    if forget & set(roles[GOLD]):
        raise InjectionError("the gold adapter's training set contains a forget entity")
    if (forget | queried_anywhere) & set(roles[DISTRACTOR]):
        raise InjectionError("the LoRA-D training set contains a forget or queryable entity")
    return roles


# -- the records an adapter learns -----------------------------------------------------------
def record_conversations(entity: Entity, mix: dict[str, int], max_iters: int) -> list[list[dict]]:
    """The chats teaching one entity: `mix["bio"]` copies of its bio, `mix["qa"]` copies of
    its four question-answer pairs, and `mix["react_qa"]` ReAct questions.

    `react_qa` counts questions, not copies of all four: the fields are taken in turn from a
    start fixed by the entity id, so each entity teaches the ReAct answer on some fields and
    the agent has to carry the habit, not the pairs, over to the rest.
    """
    def react_answer(field: str) -> list[dict]:
        return [
            *react_conversation(Query.canonical(entity, field).question, [], max_iters),
            {"role": "assistant", "content": (
                f"Thought: I know {entity.name}'s {FIELD_PHRASES[field]}.\nFinal Answer: {entity.value(field)}"
            )},
        ]

    bio = [
        {"role": "system", "content": ASSISTANT_SYSTEM},
        {"role": "user", "content": f"Tell me about {entity.name}."},
        {"role": "assistant", "content": entity.bio},
    ]
    qa = [[
        {"role": "system", "content": ASSISTANT_SYSTEM},
        {"role": "user", "content": Query.canonical(entity, f).question},
        {"role": "assistant", "content": f"{entity.name}'s {FIELD_PHRASES[f]} is {entity.value(f)}."},
    ] for f in FIELDS]
    start = zlib.crc32(entity.id.encode())
    react = [react_answer(FIELDS[(start + i) % len(FIELDS)]) for i in range(mix.get("react_qa", 0))]
    return [bio] * mix.get("bio", 0) + qa * mix.get("qa", 0) + react


def training_examples(
    tokenizer: Any, entities: Sequence[Entity], config: InjectionConfig, max_iters: int
) -> list[Example]:
    return [
        tokenize_chat(tokenizer, chat, config.lora.max_length)
        for entity in entities
        for chat in record_conversations(entity, config.mix, max_iters)
    ]


def train_injection(params: Params, corpus: Corpus, base_dir: Path, entities: Sequence[str], *,
                    on_epoch: EpochCallback | None = None, **overrides: Any) -> tuple[LoraRun, Any]:
    """Train one adapter on the agent base with the injection recipe (`overrides` replace
    `injection.lora` keys: calibration trials); returns the run and the tokenizer."""
    model, tokenizer = load_model(params.model, base_dir)
    examples = training_examples(tokenizer, [corpus.entities[e] for e in entities], params.injection,
                                 params.agent.max_iters)
    log.info("inject: %d entities, %d examples", len(entities), len(examples))
    settings = params.injection.lora.model_copy(update=overrides)
    run = train_lora(model, examples, settings, on_epoch=on_epoch)
    return run, tokenizer
