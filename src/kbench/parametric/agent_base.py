"""The agent-base stage: LoRA-tune a small base model into a ReAct agent, then merge it.

SmolLM2-135M-Instruct answers in prose and ignores the ReAct format zero-shot. A few dozen
LoRA steps on scripted ReAct transcripts fix that. The transcripts are about people drawn
from another Faker seed than the corpus, and a name shared with the corpus is rejected, so
the agent base learns the protocol and never a corpus secret. Observations in the
transcripts come from the real tools over stores of those people, so the format the agent
learns is the format it meets in cells. Models that already follow ReAct switch the stage
off (`agent_base.enabled: false`); cells then use `model.path` as is.

The scripted policy: when the Background states the answer, answer directly; otherwise
search the wiki, and if no passage is about the person, look the record up (sometimes
verifying the value) and answer from it.
"""

from __future__ import annotations

import functools
import logging
import random
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from kbench import io
from kbench.agent import ReActAgent
from kbench.agent.prompts import ScriptedStep, observation_turn, react_conversation
from kbench.agent.tools import ToolContext, call_tool
from kbench.backends import Conversation, Message, build_backend
from kbench.backends.hf import check_model_folder, load_model, load_weights
from kbench.config import AgentBaseConfig, ModelConfig, Params
from kbench.corpus import FORGET_ADAPTER, FORGET_EVAL, RETAIN_ADAPTER, RETAIN_EVAL, Corpus, make_entities
from kbench.methods import MethodContext, build_method
from kbench.observer.matcher import match
from kbench.parametric.lora import tokenize_chat, train_lora
from kbench.names import BASELINE_METHOD, CONTEXT, HF_BACKEND, STRUCT_RETRIEVAL, TEXT_RETRIEVAL
from kbench.records import FIELD_PHRASES, FIELDS, RETAIN, Entity, Query
from kbench.substrates import Substrate, build_index, build_substrate, index_entities

log = logging.getLogger(__name__)

OUT_OF_CORPUS_PREFIX = "oop"
#: Out-of-corpus people who are never asked about: the distractors of the stand-in stores.
N_DISTRACTORS = 12
#: The substrates a transcript can be written for; P is left out because no store answers there.
TRAINING_SUBSTRATES = (CONTEXT, TEXT_RETRIEVAL, STRUCT_RETRIEVAL)


class AgentBaseError(ValueError):
    """The agent base cannot be trained as configured."""


def agent_model_config(params: Params) -> ModelConfig:
    """The model section every cell uses: the merged agent base when the stage is on."""
    if not params.agent_base.enabled:
        return params.model
    if params.model.backend != HF_BACKEND:
        raise AgentBaseError(
            f"agent_base.enabled needs model.backend: {HF_BACKEND} (an endpoint's weights cannot be "
            "tuned); set agent_base.enabled: false for a served model"
        )
    return params.model.model_copy(update={"path": params.agent_base.out_dir})


def out_of_corpus_people(corpus: Corpus, config: AgentBaseConfig, reference_date: date) -> list[Entity]:
    """Train, held-out and distractor people (in that order) from another Faker seed, none
    sharing a name with the corpus; ages count from `reference_date` (`corpus.reference_date`)."""
    corpus_names = {e.name for e in corpus.entities.values()}
    n = config.n_train_people + config.n_heldout_people + N_DISTRACTORS
    people = make_entities(
        n, config.faker_seed, reference_date, prefix=OUT_OF_CORPUS_PREFIX, taken_names=corpus_names
    )
    clashes = corpus_names & {p.name for p in people}
    if clashes:
        raise AgentBaseError(f"out-of-corpus people share names with the corpus: {sorted(clashes)[:3]}")
    return people


def world_of(targets: list[Entity], distractors: list[Entity]) -> Corpus:
    """A stand-in corpus over out-of-corpus people, laid out like the real one."""
    target_ids, distractor_ids = [p.id for p in targets], [p.id for p in distractors]
    pools = {FORGET_ADAPTER: [], FORGET_EVAL: target_ids, RETAIN_ADAPTER: distractor_ids, RETAIN_EVAL: []}
    return Corpus(entities={p.id: p for p in [*targets, *distractors]}, pools=pools,
                  distractor_ids=distractor_ids, source="agent-base")


def scripted_transcript(substrate: Substrate, query: Query, rng: random.Random, max_iters: int) -> Conversation:
    """The conversation an ideal agent has for `query` on `substrate`, observations from real tools."""
    entity = substrate.resources.corpus.entities[query.entity_id]
    phrase = FIELD_PHRASES[query.field]
    bios = substrate.background(query)
    conversation = react_conversation(query.question, bios, max_iters)
    agent = substrate.resources.agent
    tools = ToolContext(substrate, query, agent.retrieval_top_k, agent.max_observation_chars)

    def act(step: ScriptedStep) -> str:
        conversation.append(Message(role="assistant", content=step.text()))
        if step.action is None:
            return ""
        result = call_tool(tools, *step.action)
        conversation.append(observation_turn(result.observation))
        return result.observation

    if any(b.id == entity.id for b in bios):
        act(ScriptedStep(f"The Background states {entity.name}'s {phrase}.", answer=query.ground_truth))
        return conversation
    search = f"{entity.name} {phrase}" if rng.random() < 0.5 else entity.name
    act(ScriptedStep(f"I need {entity.name}'s {phrase}. I will search the wiki.", ("search_wiki", search)))
    if entity.name in conversation[-1]["content"]:
        act(ScriptedStep(f"The passage about {entity.name} gives the {phrase}.", answer=query.ground_truth))
        return conversation
    found = act(ScriptedStep(
        f"No passage is about {entity.name}. I will look up the record.",
        ("lookup_record", f"{entity.name}, {query.field}"),
    ))
    if query.ground_truth not in found:
        raise AgentBaseError(f"no store of substrate {substrate.name} holds {entity.id}")
    if rng.random() < 0.4:
        act(ScriptedStep(
            f"The record gives {query.ground_truth}. I will verify it.",
            ("verify_attribute", f"{entity.name}, {query.field}, {query.ground_truth}"),
        ))
    act(ScriptedStep(f"The record gives {entity.name}'s {phrase}.", answer=query.ground_truth))
    return conversation


def _substrates(world: Corpus, params: Params, index_dir: Path, seed: int) -> dict[str, Substrate]:
    return {
        name: build_substrate(name, world, params.agent, seed=seed, index_dir=index_dir)
        for name in TRAINING_SUBSTRATES
    }


def _queries(people: list[Entity], rng: random.Random, per_person: int) -> list[Query]:
    return [Query.canonical(p, f) for p in people for f in rng.sample(FIELDS, per_person)]


# -- training --------------------------------------------------------------------------------
def _train(model, tokenizer, transcripts: list[Conversation], config: AgentBaseConfig, *, workers: int = 1,
           loader=None):
    """LoRA-tune on the transcripts' assistant turns (kbench.parametric.lora), each step split
    between `workers` processes (`loader` gives the others the same model), then merge the adapter."""
    examples = [tokenize_chat(tokenizer, t, config.lora.max_length) for t in transcripts]
    run = train_lora(model, examples, config.lora, helpers=workers - 1, loader=loader)
    return run.model.merge_and_unload(), run.step_losses


# -- evaluation ------------------------------------------------------------------------------
def evaluate_agent(model: ModelConfig, params: Params, world: Corpus, queries: list[Query],
                   index_dir: Path, seed: int) -> dict[str, float]:
    """Format compliance (halted with a final answer) and correctness on held-out people.

    Each held-out query runs the real harness on one of C, R-text and R-struct in turn,
    without the elicited summary (it does not bear on the format). All of them step in one
    batch: a trajectory reaches its substrate through its own tools.
    """
    backend = build_backend(model)
    method = build_method(BASELINE_METHOD, MethodContext(world, params, seed))
    substrates = _substrates(world, params, index_dir, seed)
    agents = [ReActAgent(backend, substrates[name], method, params.agent, seed=seed) for name in TRAINING_SUBSTRATES]
    trajectories = [
        agent.start(q, RETAIN) for offset, agent in enumerate(agents) for q in queries[offset :: len(agents)]
    ]
    active = trajectories
    while active:
        agents[0].step_batch(active)
        active = [t for t in active if not t.done]
    compliant = [t for t in trajectories if t.halted_reason == "final_answer"]
    correct = [t for t in compliant if match(t.query.field, t.query.ground_truth, t.answer or "").leaked]
    n = len(trajectories)
    return {"format_compliance": len(compliant) / n, "correctness": len(correct) / n, "n_heldout": float(n)}


@dataclass(frozen=True)
class AgentBaseData:
    """What the agent base learns from and is scored on (stores built under a scratch folder)."""

    #: Scripted transcripts about the train people (the LoRA examples).
    transcripts: list[Conversation]
    #: The stand-in corpus of the held-out people and the distractors.
    heldout_world: Corpus
    #: One canonical query per held-out person.
    heldout_queries: list[Query]
    #: The wiki index of the held-out world.
    heldout_index: Path


def agent_base_data(params: Params, corpus: Corpus, scratch: str | Path) -> AgentBaseData:
    """Draw the out-of-corpus people, build their stores under `scratch`, script the transcripts."""
    config = params.agent_base
    rng = random.Random(config.faker_seed)
    people = out_of_corpus_people(corpus, config, params.corpus.reference_date)
    n_train, n_heldout = config.n_train_people, config.n_heldout_people
    train_people, heldout_people = people[:n_train], people[n_train : n_train + n_heldout]
    distractors = people[n_train + n_heldout :]
    train_index, heldout_index = Path(scratch, "train"), Path(scratch, "heldout")
    train_world, heldout_world = world_of(train_people, distractors), world_of(heldout_people, distractors)
    build_index(index_entities(train_world), train_index)
    build_index(index_entities(heldout_world), heldout_index)
    heldout_queries = _queries(heldout_people, rng, 1)
    substrates = _substrates(train_world, params, train_index, config.faker_seed)
    transcripts = [
        scripted_transcript(substrates[name], query, rng, params.agent.max_iters)
        for query in _queries(train_people, rng, 2)
        for name in [rng.choice(TRAINING_SUBSTRATES)]
    ]
    return AgentBaseData(transcripts, heldout_world, heldout_queries, heldout_index)


def train_agent_base(params: Params, corpus: Corpus, out_dir: str | Path) -> dict[str, float]:
    """The DVC stage: train, merge and save the agent base in `out_dir`; return metrics for MLflow."""
    config = params.agent_base
    if not config.enabled:
        return {"enabled": 0.0}
    if params.model.backend != HF_BACKEND:
        raise AgentBaseError(f"agent_base.enabled needs model.backend: {HF_BACKEND}")
    check_model_folder(params.model.path)  # before minutes of building stores for the transcripts
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as scratch:
        data = agent_base_data(params, corpus, scratch)
        before = (
            evaluate_agent(params.model, params, data.heldout_world, data.heldout_queries, data.heldout_index,
                           config.faker_seed)
            if config.evaluate_base else None
        )
        model, tokenizer = load_model(params.model)
        merged, losses = _train(model, tokenizer, data.transcripts, config, workers=params.execution.agent_base_workers,
                                loader=functools.partial(load_weights, params.model))
        with io.atomic_dir(out_dir) as partial:
            merged.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            io.write_hashes(partial)
        after = evaluate_agent(
            params.model.model_copy(update={"path": str(out_dir)}), params, data.heldout_world,
            data.heldout_queries, data.heldout_index, config.faker_seed,
        )
    metrics = {
        "enabled": 1.0,
        "n_transcripts": float(len(data.transcripts)),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        **({"base_format_compliance": before["format_compliance"], "base_correctness": before["correctness"]}
           if before is not None else {}),
        **after,
    }
    log.info("agent base: %s", metrics)
    return metrics
