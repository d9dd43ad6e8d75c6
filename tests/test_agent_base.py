"""The agent-base stage: out-of-corpus people, scripted transcripts, assistant-only labels, a tiny run."""

import random

import pytest
from transformers import AutoTokenizer

from _agent_fixtures import params, small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from kbench.agent.parser import parse_step
from kbench.parametric.agent_base import (
    N_DISTRACTORS,
    AgentBaseError,
    agent_model_config,
    out_of_corpus_people,
    scripted_transcript,
    train_agent_base,
    world_of,
)
from kbench.config import AgentBaseConfig, AgentBaseLora, ModelConfig
from kbench.parametric.lora import tokenize_chat
from kbench.backends.packaged import is_model_folder
from kbench.substrates import build_index, build_substrate, index_entities


@pytest.fixture(scope="module")
def people(small_corpus, params):  # noqa: F811
    return out_of_corpus_people(
        small_corpus, params.agent_base.model_copy(update={"n_train_people": 12}), params.corpus.reference_date)


def test_people_are_outside_the_corpus(small_corpus, people):  # noqa: F811
    corpus_names = {e.name for e in small_corpus.entities.values()}
    assert len(people) == 12 + 10 + N_DISTRACTORS and all(p.id.startswith("oop-") for p in people)
    assert not corpus_names & {p.name for p in people}
    assert not set(small_corpus.entities) & {p.id for p in people}


def test_a_name_clash_is_redrawn(small_corpus, params):  # noqa: F811
    """Drawing with the corpus's own Faker seed would repeat its names; every one is redrawn."""
    config = params.agent_base.model_copy(update={"faker_seed": params.corpus.faker_seed, "n_train_people": 20})
    drawn = out_of_corpus_people(small_corpus, config, params.corpus.reference_date)
    assert not {p.name for p in drawn} & {e.name for e in small_corpus.entities.values()}


@pytest.fixture(scope="module")
def transcripts(people, params, tmp_path_factory):  # noqa: F811
    world = world_of(people[:-N_DISTRACTORS], people[-N_DISTRACTORS:])
    index_dir = build_index(index_entities(world), tmp_path_factory.mktemp("oop-index"))
    rng = random.Random(0)
    out = []
    for name in ("C", "R-text", "R-struct"):
        substrate = build_substrate(name, world, params.agent, seed=0, index_dir=index_dir)
        for person in people[:8]:
            for query in world.queries_for(person.id):
                out.append((name, scripted_transcript(substrate, query, rng, params.agent.max_iters)))
    return out


def test_transcripts_cover_all_tools_and_answers_from_context(transcripts):
    steps = [parse_step(m["content"]) for _, t in transcripts for m in t if m["role"] == "assistant"]
    assert all(s.is_valid for s in steps)
    tools = {s.action.tool for s in steps if s.action}
    assert tools == {"search_wiki", "lookup_record", "verify_attribute"}
    context = [t for name, t in transcripts if name == "C"]
    assert all(len(t) == 3 and "Final Answer:" in t[-1]["content"] for t in context)
    struct = [t for name, t in transcripts if name == "R-struct"]
    assert all("Action: lookup_record[" in "".join(m["content"] for m in t) for t in struct)


def test_transcripts_answer_with_the_ground_truth(transcripts):
    for _, transcript in transcripts:
        question = transcript[1]["content"]
        final = parse_step(transcript[-1]["content"])
        assert final.answer and final.answer in "\n".join(m["content"] for m in transcript[:-1]), question


def test_only_assistant_tokens_are_learned(transcripts, tiny_model_dir):  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    _, transcript = transcripts[-1]
    example = tokenize_chat(tokenizer, transcript, 4096)
    ids, labels = example.input_ids, example.labels
    learned = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    assistant = [m["content"] for m in transcript if m["role"] == "assistant"]
    assert learned.replace("<|im_end|>", "") == "".join(assistant)
    assert learned.count("<|im_end|>") == len(assistant)  # the model learns to end its turn
    assert "Observation:" not in learned and "Question:" not in learned


def test_agent_model_config(params):  # noqa: F811
    assert agent_model_config(params).path == params.agent_base.out_dir
    off = params.model_copy(update={"agent_base": AgentBaseConfig(enabled=False)})
    assert agent_model_config(off) == params.model
    served = params.model_copy(update={"model": ModelConfig(backend="openai", path="m", base_url="http://x/v1")})
    with pytest.raises(AgentBaseError, match="agent_base.enabled: false"):
        agent_model_config(served)


def test_disabled_stage_trains_nothing(params, small_corpus, tmp_path):  # noqa: F811
    off = params.model_copy(update={"agent_base": AgentBaseConfig(enabled=False)})
    assert train_agent_base(off, small_corpus, tmp_path / "base") == {"enabled": 0.0}
    assert not (tmp_path / "base").exists()


def test_tiny_model_trains_merges_and_reports(params, small_corpus, tiny_model_dir, tmp_path):  # noqa: F811
    tiny = params.model_copy(update={
        "model": ModelConfig(path=str(tiny_model_dir), device="cpu"),
        "agent": params.agent.model_copy(update={"max_new_tokens": 8, "max_iters": 2}),
        "agent_base": AgentBaseConfig(n_train_people=4, n_heldout_people=3, evaluate_base=True,
                                      lora=AgentBaseLora(steps=3, batch_size=2, learning_rate=1e-2)),
    })
    metrics = train_agent_base(tiny, small_corpus, tmp_path / "base")
    assert is_model_folder(tmp_path / "base")
    assert metrics["n_transcripts"] == 8 and metrics["n_heldout"] == 3
    for key in ("format_compliance", "correctness", "base_format_compliance", "base_correctness"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["final_loss"] < metrics["first_loss"]
