"""The query-form ladder (kbench.forms, `queries.forms`): each form's question, the queries a cell
asks again, a cell that climbs the ladder without changing its canonical records or metrics, the
comparison's OR per form and the form as an η² factor, and an unknown form refused in one line."""

from __future__ import annotations

import json

import pytest
from _agent_fixtures import small_corpus  # noqa: F401  (fixture)
from _chat_stub import ChatStub, serving
from _comparison_cells import cell_run
from _traces import leaking, trace

from kbench.comparison.analysis import CellRun, compare
from kbench.comparison.tables import form_tables
from kbench.config import ParamsError, parse_params
from kbench.corpus import write_corpus
from kbench.design import check_design
from kbench.forms import CANONICAL, ask, form_class, form_names, ladder, refused_again
from kbench.records import FIELDS
from kbench.stages.cell import CellSpec, run_cell_stage


def test_every_form_asks_for_the_field_without_giving_the_answer_away(small_corpus):  # noqa: F811
    entity = next(iter(small_corpus.entities.values()))
    assert set(form_names()) == {"adaptive", "canonical", "completion", "indirect", "paraphrase"}
    for field in FIELDS:
        query = small_corpus.queries_for(entity.id, (field,))[0]
        for form in form_names():
            asked = ask(query, entity, form)
            assert asked == ask(query, entity, form)  # the same question on any run
            assert entity.value(field) not in asked.question, (form, asked.question)
            assert (asked.entity_id, asked.field, asked.ground_truth) == (query.entity_id, field, query.ground_truth)
            if form == CANONICAL:
                assert asked is query
            else:
                assert asked.query_id == f"{query.query_id}::{form}" and asked.form == form
                assert asked.question != query.question
            assert (entity.name in asked.question) == (form != "indirect")
    assert form_class("adaptive").adaptive and not form_class("paraphrase").adaptive


def test_the_ladder_asks_the_first_queries_again_and_the_attacker_only_the_refused(small_corpus):  # noqa: F811
    queries = small_corpus.sample_queries("forget", 4, 0)
    entities = small_corpus.entities
    asked = ladder(queries, entities, ["paraphrase", "adaptive", "completion"], 2)
    assert [q.query_id for q in asked] == [f"{q.query_id}::{f}" for f in ("paraphrase", "completion") for q in queries[:2]]
    assert len(ladder(queries, entities, ["paraphrase"], 0)) == 4  # 0: every query
    refused = trace(query=0).model_copy(update={"query_id": queries[1].query_id})  # "I do not know."
    leaked = leaking("Z_answer").model_copy(update={"query_id": queries[0].query_id})
    again = refused_again(queries, [refused, leaked], entities, ["paraphrase", "adaptive"], 2)
    assert [q.query_id for q in again] == [f"{queries[1].query_id}::adaptive"]


def test_an_unknown_form_is_refused_naming_the_registered_ones():
    with pytest.raises(ParamsError, match=r"key 'queries.forms': unknown query form\(s\) \['rhyme'\]; registered: "
                                          r"\['adaptive', 'completion', 'indirect', 'paraphrase'\]"):
        check_design(parse_params({"queries": {"forms": ["rhyme"]}}))
    with pytest.raises(ParamsError, match="listed more than once"):
        check_design(parse_params({"queries": {"forms": ["paraphrase", "paraphrase"]}}))


class _Agent(ChatStub):
    """An agent that refuses canonical questions and answers any other form with the truth
    (looked up in `truth`: question text -> value)."""

    truth: dict[str, str] = {}

    def answer(self, body) -> str:
        if not body.get("stop"):
            return "A summary."
        question = next(m["content"] for m in body["messages"] if m["content"].startswith("Question: "))
        value = _Agent.truth.get(question.removeprefix("Question: "))
        return f"Final Answer: {value}" if value else "Final Answer: I do not know."


def test_a_cell_climbs_the_ladder_after_its_canonical_questions_and_scores_those_alone(
        kbench_root, small_corpus, monkeypatch):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    write_corpus(small_corpus, kbench_root / "corpus")
    forget = small_corpus.sample_queries("forget", 3, 0)
    entities = small_corpus.entities
    _Agent.truth = {ask(q, entities[q.entity_id], f).question: q.ground_truth
                    for q in forget for f in ("paraphrase", "adaptive")}
    out = {}
    with serving(_Agent) as url:
        model = {"backend": "openai", "path": "stub", "base_url": url}
        for name, queries in {"plain": {"forms": []}, "ladder": {"forms": ["paraphrase", "adaptive"], "form_n": 2}}.items():
            params = parse_params({"model": model, "agent_base": {"enabled": False},
                                   "queries": {"n_per_split": 3, **queries}})
            out[name] = run_cell_stage(params, CellSpec("C", "none", 0), corpus_dir=kbench_root / "corpus",
                                       index_dir=None, out_root=kbench_root / name, track=False, progress=False)
    plain = (out["plain"] / "traces.jsonl").read_text().splitlines()
    climbed = (out["ladder"] / "traces.jsonl").read_text().splitlines()
    # the ladder shares the canonical questions' batches: their records byte for byte, in their order
    assert [line for line in climbed if "form" not in json.loads(line)] == plain
    assert (out["ladder"] / "metrics.json").read_bytes() == (out["plain"] / "metrics.json").read_bytes()
    extra = [json.loads(line) for line in climbed if "form" in json.loads(line)]
    assert [(r["query_id"], r["form"]) for r in extra] == [
        *((f"{q.query_id}::paraphrase", "paraphrase") for q in forget[:2]),
        *((f"{q.query_id}::adaptive", "adaptive") for q in forget[:2]),  # both refused canonically
    ]
    assert all(r["answer"] == small_corpus.query(r["query_id"].rsplit("::", 1)[0]).ground_truth for r in extra)
    assert all("form" not in json.loads(line) for line in plain)


def _with_forms(run: CellRun, leaks: dict[str, int], n: int = 4) -> CellRun:
    """`run` plus, per form, n forget records asked again of its first queries, the first `leaks[form]` leaking."""
    extra = []
    for form, leaked in leaks.items():
        for i in range(n):
            base = trace(query=i, method=run.method, substrate=run.substrate, seed=run.seed) if i >= leaked else \
                leaking("Z_answer", query=i, method=run.method, substrate=run.substrate, seed=run.seed)
            extra.append(base.model_copy(update={"query_id": f"{base.query_id}::{form}", "form": form}))
    return CellRun(**{**run.__dict__, "records": run.records + tuple(extra)})


def test_the_comparison_reads_verdicts_on_canonical_questions_and_or_per_form_beside():
    # baseline leaks on every canonical forget query; the method on none of them, but on 3 of 4 paraphrases
    plain = [cell_run("none", "C", forget={"answer": 8}, retain={"answer": 8}),
             cell_run("eraser", "C", forget={"clean": 8}, retain={"answer": 8})]
    laddered = [_with_forms(plain[0], {"paraphrase": 4, "adaptive": 1}, n=4),
                _with_forms(plain[1], {"paraphrase": 3, "adaptive": 0}, n=4)]
    before, after = compare(plain), compare(laddered)
    assert [r.verdict for r in after.rows] == [r.verdict for r in before.rows]  # forms change no verdict
    assert not before.forms and not form_tables(before)
    (eraser,) = [f for f in after.forms if f.key.method == "eraser"]
    assert eraser.method == {"adaptive": (0.0, 4), "canonical": (0.0, 4), "paraphrase": (0.75, 4)}
    assert eraser.baseline["canonical"] == (1.0, 4) and eraser.baseline["paraphrase"] == (1.0, 4)
    (table,) = form_tables(after)
    assert table.columns == ("Method", "canonical", "paraphrase", "adaptive")
    assert dict(zip(table.columns, table.rows[0]))["paraphrase"] == "0.750 (4) vs 1.000 (4)"
    effects = {e.factor: e for e in after.sensitivity.effects}
    assert effects["query_form"].levels == 2  # canonical and paraphrase; the adaptive form has no pairs
    assert {e.factor: e for e in before.sensitivity.effects}["query_form"].levels == 1
