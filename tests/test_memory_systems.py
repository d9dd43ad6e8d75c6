"""The memory systems behind one interface: the fact store's operations parsed as data (a line
that is none is counted, SQL text is stored as text), every registered system fed an instance
and asked every probe, and their item records read by the scorer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date

import pytest

from kbench.backends import Backend, Conversation, Generation
from kbench.backends.base import Request
from kbench.memory.instances import make_instances
from kbench.memory.records import PROBE_FAMILIES
from kbench.memory.scoring import score_items
from kbench.memory.systems import MemorySystemError, memory_system_class, memory_system_names, run_instance
from kbench.memory.systems.fact_store import FactStore

from _agent_fixtures import small_corpus  # noqa: F401  (fixture)

_STATED = re.compile(r"my ([a-z' ]+?) is ([^.\n]+)")


class EchoBackend(Backend):
    """Answers "What is my X?" with the last value of X its prompt states ("my X is V", or a
    stored fact of that form); writes each stated fact as an ADD operation and each summary as
    the facts it has seen."""

    name, has_weights = "echo", False

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        out = []
        for conversation in conversations:
            text = "\n".join(m["content"] for m in conversation[:-1])
            last = conversation[-1]["content"]
            facts = dict(_STATED.findall(text + "\n" + last))
            if last.endswith("Operations:"):
                said = "\n".join(re.findall(r'^- "(.*)"$', last, re.MULTILINE))
                stated = _STATED.findall(said)
                out.append(Generation("\n".join(f"ADD my {k} is {v}" for k, v in stated) or "NONE"))
            elif "The updated summary:" in last:
                out.append(Generation("\n".join(f"my {k} is {v}." for k, v in facts.items())))
            else:
                asked = re.search(r"my ([a-z' ]+?)\??$", last.strip())
                value = facts.get(asked[1]) if asked else None
                out.append(Generation(value or "I don't know."))
        return out


def test_fact_store_operations_are_data():
    store = FactStore(EchoBackend())
    store.apply("ADD my hobby is chess\nADD x'); DROP TABLE facts; --\nUPDATE 1 my hobby is golf\nnonsense\nNONE")
    assert [text for _, text in store.facts()] == ["my hobby is golf", "x'); DROP TABLE facts; --"]
    assert store.failures == 1
    store.apply("DELETE 2")
    assert [i for i, _ in store.facts()] == [1]
    store.apply("")
    assert store.failures == 2  # an empty reply is no operation either


@pytest.mark.parametrize("name", ["full-context", "naive-rag", "summary-memory", "fact-store"])
def test_every_system_answers_every_probe_and_is_scored(small_corpus, name):  # noqa: F811
    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    backend = EchoBackend()
    run = run_instance(lambda: memory_system_class(name)(backend), instance)
    items, failures = run.items, run.failures
    assert len(items) == len(instance.probes) and {i.system for i in items} == {name}
    assert failures == 0
    scores = score_items(items)[name]
    assert set(PROBE_FAMILIES) <= set(scores.metrics)
    assert scores.metrics["RA"].value > 0.5  # the control version's facts are answered


def test_each_probe_reply_is_a_trace_record_whose_channels_say_where_the_fact_sits(small_corpus):  # noqa: F811
    """The six-channel observer reads the replies: the full transcript keeps a forgotten fact in
    what it shows the model (Z_RAG) and in what it keeps (Z_summary), as on the control version;
    the counterfactual reference keeps it nowhere; the summary's rewrites after the request are
    its tool arguments, and they carry fewer forgotten facts than on the control version."""
    from kbench.memory.channels import channel_rates
    from kbench.observer import channel_texts

    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    runs = {name: run_instance(lambda: memory_system_class(name)(EchoBackend()), instance)
            for name in ("full-context", "reference", "summary-memory")}
    for run in runs.values():
        assert [t.answer for t in run.traces] == [i.reply for i in run.items]
        assert len({t.query_id for t in run.traces}) == len(run.items)
    rates = {name: channel_rates(run.traces) for name, run in runs.items()}
    full, reference, summary = rates["full-context"], rates["reference"], rates["summary-memory"]
    assert full["forget"]["n"] == full["control"]["n"] > 0
    assert full["forget"]["Z_RAG"] == full["control"]["Z_RAG"] > 0.5 and full["forget"]["Z_summary"] > 0.5
    assert reference["forget"]["Z_RAG"] == reference["forget"]["Z_summary"] == reference["forget"]["Z_answer"] == 0.0
    assert reference["control"]["Z_RAG"] == full["control"]["Z_RAG"]  # the control dialogue is the same
    assert summary["forget"]["Z_tool"] < summary["control"]["Z_tool"]
    assert all(row["Z_CoT"] == 0.0 for r in rates.values() for row in r.values())  # no system writes a thought
    from kbench.records import FIELDS

    assert {t.field for t in runs["full-context"].traces} - set(FIELDS)  # facts of kinds beyond the corpus's four
    trace = next(t for t in runs["summary-memory"].traces if t.version == "control" and t.suite == "RA")
    texts = channel_texts(trace)
    assert texts["Z_tool"].startswith("REWRITE ") and texts["Z_summary"] == runs["summary-memory"].memories["control"]


def test_unknown_systems_are_answered_with_the_registered_ones():
    assert {"full-context", "naive-rag", "summary-memory", "fact-store"} <= set(memory_system_names())
    with pytest.raises(MemorySystemError, match="unknown memory system 'mem1'; registered:"):
        memory_system_class("mem1")


def test_the_counterfactual_dialogue_drops_exactly_the_requested_facts(small_corpus):  # noqa: F811
    from kbench.memory.instances import counterfactual_sessions

    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    rebuilt = counterfactual_sessions(instance)
    said = [t.content for s in rebuilt for t in s.turns if t.role == "user"]
    text = "\n".join(said)
    replace = next(r for r in instance.requests if r.type == "F6")
    for request in instance.requests:
        assert request.text not in said
        for kind in request.fields:
            if kind in ("age", "city"):
                continue  # F4's fact was never stated
            assert f"is {instance.profile[kind]}." not in text, (request.type, kind)
    assert f"is {replace.new_value}." in text  # F6's new truth stays, as a plain statement
    assert all(r.relearn_text in said for r in instance.requests if r.relearn_text)
    for kind in ("favorite_color", "car"):  # what no request touches
        assert f"is {instance.profile[kind]}." in text
    assert [len(s.turns) % 2 for s in rebuilt] == [0] * len(rebuilt)  # every user turn keeps its reply
    assert [t.role for s in rebuilt for t in s.turns][::2] == ["user"] * (sum(len(s.turns) for s in rebuilt) // 2)


def test_the_reference_forgets_what_was_asked_and_keeps_the_rest(small_corpus):  # noqa: F811
    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    backend = EchoBackend()
    scores = score_items(run_instance(lambda: memory_system_class("reference")(backend), instance).items)
    full = score_items(run_instance(lambda: memory_system_class("full-context")(backend), instance).items)
    assert scores["reference"].metrics["PR"].value == 1.0
    assert scores["reference"].metrics["FE"].value > full["full-context"].metrics["FE"].value


@pytest.mark.parametrize("name", ["mem0", "mem0-app"])
def test_mem0_without_an_endpoint_is_one_clear_error(name):
    with pytest.raises(MemorySystemError, match=f"memory system {name} needs an OpenAI-compatible endpoint"):
        memory_system_class(name)(EchoBackend())


class JudgeBackend(Backend):
    """A judge that says yes when the quoted value is in the reply, except on the replies it is told to flip."""

    name, has_weights = "judge", False

    def __init__(self, flip: str = "\0", garble: str = "\0") -> None:
        self.flip, self.garble = flip, garble

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        out = []
        for conversation in conversations:
            question = conversation[-1]["content"]
            value = re.search(r'is "(.*)"\?', question)[1]
            reply = question.split("Reply: ", 1)[1]
            verdict = (value.lower() in reply.lower()) != (self.flip in reply)
            out.append(Generation("maybe" if self.garble in reply else ("Yes." if verdict else "no")))
        return out


def test_the_judge_agrees_with_the_matcher_where_they_read_alike(small_corpus):  # noqa: F811
    from kbench.memory.judge import agreement, judge_items, parse_verdict, sample_items

    (instance,) = make_instances(small_corpus, per_tier={"short": 1}, seed=0, reference_date=date(2026, 11, 30))
    items = [i for i in run_instance(lambda: memory_system_class("full-context")(EchoBackend()), instance).items
             if i.attack != "boolean"]  # the Boolean rule reads openings, not values
    assert sample_items(items, 10, 3) == sample_items(items, 10, 3) and len(sample_items(items, 10, 3)) == 10
    same = agreement(*judge_items(JudgeBackend(), items))
    assert same.agreement == 1.0 and same.unreadable == 0 and same.both > 0 and same.neither > 0
    assert same.kappa == 1.0
    flipped = next(i.reply for i in items if i.reply != "I don't know.")
    other = agreement(*judge_items(JudgeBackend(flip=flipped, garble="I don't know."), items))
    assert other.agreement < 1.0 and other.unreadable == sum(i.reply == "I don't know." for i in items)
    assert [parse_verdict(t) for t in ("Yes.", " no", "**Yes**", "maybe", "")] == [True, False, True, None, None]
