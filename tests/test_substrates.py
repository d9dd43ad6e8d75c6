"""Substrates: where the target lives, what each store may show, and the prompts they build."""

import pytest

from _agent_fixtures import index_dir, params, small_corpus  # noqa: F401  (fixtures)
from kbench.agent.prompts import react_system_prompt, summary_conversation
from kbench.substrates import (
    RecordStore,
    SubstrateError,
    build_substrate,
    substrate_class,
    substrate_names,
)


@pytest.fixture
def target(small_corpus):  # noqa: F811
    return small_corpus.queries_for(small_corpus.pools["forget_eval"][0])[0]


def make(name, corpus, params, index_dir, seed=0, **kw):  # noqa: F811
    return build_substrate(name, corpus, params.agent, seed=seed, index_dir=index_dir, **kw)


def test_registry_has_the_four_substrates():
    assert substrate_names() == ["C", "P", "R-struct", "R-text"]
    with pytest.raises(SubstrateError, match="unknown substrate"):
        substrate_class("Z")


def test_context_prompt_holds_target_bio_and_k_distractors(small_corpus, params, index_dir, target):  # noqa: F811
    substrate = make("C", small_corpus, params, index_dir)
    bios = substrate.background(target)
    ids = [b.id for b in bios]
    assert target.entity_id in ids and len(ids) == 1 + params.agent.k_distractors
    assert set(ids) - {target.entity_id} <= set(small_corpus.distractor_ids)
    prompt = react_system_prompt(bios, params.agent.max_iters)
    assert small_corpus.entities[target.entity_id].bio in prompt
    for tool in ("search_wiki[query]", "lookup_record[name, field]", "verify_attribute[name, field, value]"):
        assert tool in prompt
    assert substrate.background(target) == bios  # the same for a (seed, query)
    other_seed = make("C", small_corpus, params, index_dir, seed=137).background(target)
    assert [b.id for b in other_seed] != ids


@pytest.mark.parametrize("name", ["R-text", "R-struct"])
def test_retrieval_prompts_hold_no_bios(small_corpus, params, index_dir, target, name):  # noqa: F811
    substrate = make(name, small_corpus, params, index_dir)
    assert substrate.background(target) == []
    prompt = react_system_prompt([], params.agent.max_iters)
    assert small_corpus.entities[target.entity_id].name not in prompt
    assert "Background" not in prompt


def test_summary_prompt_sees_the_same_substrate(small_corpus, params, index_dir, target):  # noqa: F811
    entity = small_corpus.entities[target.entity_id]
    with_bios = summary_conversation(entity.name, make("C", small_corpus, params, index_dir).background(target))
    assert entity.bio in with_bios[0]["content"]
    assert "Briefly summarize everything you know about " + entity.name in with_bios[1]["content"]
    without = summary_conversation(entity.name, make("R-text", small_corpus, params, index_dir).background(target))
    assert entity.bio not in without[0]["content"]


def test_only_the_cell_substrate_exposes_the_target(small_corpus, params, index_dir, target):  # noqa: F811
    r_text = make("R-text", small_corpus, params, index_dir)
    r_struct = make("R-struct", small_corpus, params, index_dir)
    context = make("C", small_corpus, params, index_dir)
    assert r_text.searchable(target) is None and r_struct.readable(target) is None
    for substrate in (context, r_struct):
        assert target.entity_id not in substrate.searchable(target)
    for substrate in (context, r_text):
        assert target.entity_id not in substrate.readable(target)


def test_r_text_needs_an_index_and_p_an_adapter(small_corpus, params):  # noqa: F811
    with pytest.raises(SubstrateError, match="FAISS index"):
        build_substrate("R-text", small_corpus, params.agent, seed=0)
    with pytest.raises(SubstrateError, match="adapter"):
        build_substrate("P", small_corpus, params.agent, seed=0)
    p = build_substrate("P", small_corpus, params.agent, seed=0, adapter_path="some/adapter")
    assert p.adapter_path == "some/adapter" and p.background(small_corpus.queries_for("pii-00010")[0]) == []


def test_index_search_ranks_the_bio_of_the_named_person_first(small_corpus, index_dir, target):  # noqa: F811
    from kbench.substrates import TextIndex

    index = TextIndex.load(index_dir)
    entity = small_corpus.entities[target.entity_id]
    hits = index.search(f"{entity.name} date of birth", 3)
    assert hits[0].doc_id == entity.id and len(hits) == 3
    visible = frozenset(small_corpus.distractor_ids)
    assert all(h.doc_id in visible for h in index.search(entity.name, 3, visible))


def test_record_store_matches_names_loosely(small_corpus):  # noqa: F811
    entity = next(iter(small_corpus.entities.values()))
    store = RecordStore([entity])
    assert store.find(f"  {entity.name.upper()} ")["entity_id"] == entity.id
    assert store.find(entity.name, frozenset()) is None
