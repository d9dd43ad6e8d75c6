"""The three tools on untrusted, model-written arguments."""

import pytest

from _agent_fixtures import index_dir, params, small_corpus  # noqa: F401  (fixtures)
from kbench.agent.tools import ToolContext, call_tool, normalize_field, split_args
from kbench.substrates import build_substrate


@pytest.fixture
def target(small_corpus):  # noqa: F811
    return small_corpus.queries_for(small_corpus.pools["forget_eval"][1])[3]  # employer


def context(name, corpus, params, index_dir, query):  # noqa: F811
    substrate = build_substrate(name, corpus, params.agent, seed=0, index_dir=index_dir)
    return ToolContext(substrate, query, params.agent.retrieval_top_k, params.agent.max_observation_chars)


def test_sql_injection_argument_is_just_a_name_not_found(small_corpus, params, index_dir, target):  # noqa: F811
    tools = context("R-struct", small_corpus, params, index_dir, target)
    before = tools.substrate.records.count()
    for tool, args in [
        ("lookup_record", "x'); DROP TABLE records;--, employer"),
        ("verify_attribute", "x'); DROP TABLE records;--, employer, y"),
        ("lookup_record", "' OR '1'='1, employer"),
    ]:
        result = call_tool(tools, tool, args)
        assert result.observation.startswith("No record found") and not result.error
    assert tools.substrate.records.count() == before


def test_lookup_and_verify_on_r_struct(small_corpus, params, index_dir, target):  # noqa: F811
    entity = small_corpus.entities[target.entity_id]
    tools = context("R-struct", small_corpus, params, index_dir, target)
    found = call_tool(tools, "lookup_record", f"{entity.name}, employer")
    assert found.observation == f"{entity.name}'s employer: {entity.employer}"
    assert call_tool(tools, "lookup_record", f'name="{entity.name}", field=company').observation == found.observation
    yes = call_tool(tools, "verify_attribute", f"{entity.name}, address, {entity.address.upper()}")
    assert yes.observation.startswith("Yes")
    no = call_tool(tools, "verify_attribute", f"{entity.name}, address, 1 Nowhere Road, Springfield")
    assert no.observation.startswith("No:") and entity.address not in no.observation


def test_record_tools_hide_the_target_outside_r_struct(small_corpus, params, index_dir, target):  # noqa: F811
    entity = small_corpus.entities[target.entity_id]
    distractor = small_corpus.entities[small_corpus.distractor_ids[0]]
    tools = context("C", small_corpus, params, index_dir, target)
    assert call_tool(tools, "lookup_record", f"{entity.name}, employer").observation.startswith("No record")
    assert distractor.employer in call_tool(tools, "lookup_record", f"{distractor.name}, employer").observation


def test_search_wiki_records_the_retrieval(small_corpus, params, index_dir, target):  # noqa: F811
    entity = small_corpus.entities[target.entity_id]
    result = call_tool(context("R-text", small_corpus, params, index_dir, target), "search_wiki", entity.name)
    assert entity.bio in result.observation
    assert result.retrieval.query == entity.name
    assert result.retrieval.doc_ids[0] == entity.id and len(result.retrieval.doc_ids) == params.agent.retrieval_top_k
    hidden = call_tool(context("R-struct", small_corpus, params, index_dir, target), "search_wiki", entity.name)
    assert entity.id not in hidden.retrieval.doc_ids and entity.bio not in hidden.observation


@pytest.mark.parametrize(
    "tool, args, message",
    [
        ("delete_everything", "now", "unknown tool"),
        ("lookup_record", "Ann Lee", "takes lookup_record[name, field]"),
        ("lookup_record", "Ann Lee, shoe size", "unknown field 'shoe size'"),
        ("verify_attribute", "Ann Lee, employer", "takes verify_attribute"),
        ("search_wiki", "  ", "takes search_wiki[query]"),
    ],
)
def test_bad_calls_become_error_observations(small_corpus, params, index_dir, target, tool, args, message):  # noqa: F811
    result = call_tool(context("R-struct", small_corpus, params, index_dir, target), tool, args)
    assert result.error and message in result.observation


def test_a_failing_tool_is_an_observation_not_a_crash(small_corpus, params, index_dir, target, monkeypatch):  # noqa: F811
    tools = context("R-struct", small_corpus, params, index_dir, target)
    monkeypatch.setattr(type(tools.substrate.records), "find", lambda *a: 1 / 0)
    result = call_tool(tools, "lookup_record", "Ann Lee, employer")
    assert result.error and "ZeroDivisionError" in result.observation


def test_argument_helpers():
    assert split_args("Ann Lee, address, 1 Main St, Springfield, IL", 3) == ["Ann Lee", "address", "1 Main St, Springfield, IL"]
    assert split_args("'Ann Lee'", 1) == ["Ann Lee"]
    assert [normalize_field(t) for t in ("Date of Birth", "DOB", "home address", "job", "nope")] == [
        "date_of_birth", "date_of_birth", "address", "occupation", None]


def test_a_huge_argument_is_cut_in_the_observation_and_marked(small_corpus, params, index_dir, target):  # noqa: F811
    tools = context("R-struct", small_corpus, params, index_dir, target)
    limit = params.agent.max_observation_chars
    result = call_tool(tools, "lookup_record", "x" * 100_000 + ", employer")
    assert result.cut == len("No record found for ''.") + 100_000 - limit
    assert result.observation == f"No record found for '{'x' * (limit - 21)} [... {result.cut} characters cut]"
    short = call_tool(tools, "lookup_record", "Nobody, employer")
    assert short.cut == 0 and short.observation == "No record found for 'Nobody'."
