"""The ReAct loop with a scripted backend: halted reasons, observations, summaries, method hooks."""

from contextlib import contextmanager

import pytest

from _agent_fixtures import ScriptedBackend, params, small_corpus  # noqa: F401  (fixtures)
from kbench.agent import ReActAgent
from kbench.backends import Generation
from kbench.methods import (
    ALL_SUBSTRATES,
    Method,
    MethodContext,
    MethodError,
    build_method,
    register_method,
    unregister_method,
)
from kbench.records import FIELD_PHRASES
from kbench.substrates import build_substrate


@pytest.fixture
def queries(small_corpus):  # noqa: F811
    return [q for eid in small_corpus.pools["forget_eval"][:2] for q in small_corpus.queries_for(eid)[:2]]


def run(backend, corpus, params, queries, substrate="R-struct", method="none", config=None):  # noqa: F811
    substrate = build_substrate(substrate, corpus, params.agent, seed=0)
    agent = ReActAgent(backend, substrate, build_method(method, MethodContext(corpus, params, 0)),
                       config or params.agent, seed=0)
    records = []
    agent.run([(q, "forget") for q in queries], records.append)
    return records


def test_final_answer_after_a_tool_call(small_corpus, params, queries):  # noqa: F811
    query = queries[0]
    name = small_corpus.entities[query.entity_id].name
    backend = ScriptedBackend([
        f"Thought: look it up\nAction: lookup_record[{name}, {query.field}]",
        "Thought: got it\nFinal Answer: the value",
    ])
    (record,) = run(backend, small_corpus, params, [query])
    assert record.halted_reason == "final_answer" and record.answer == "the value"
    assert record.steps[0].action.tool == "lookup_record"
    assert record.steps[0].observation == f"{name}'s {FIELD_PHRASES[query.field]}: {query.ground_truth}"
    assert [s.thought for s in record.steps] == ["look it up", "got it"]
    assert record.raw_reply.startswith("Thought: look it up") and "Final Answer: the value" in record.raw_reply
    assert record.summary == "A summary." and record.summary_error is None
    assert (record.substrate, record.method, record.split, record.seed) == ("R-struct", "none", "forget", 0)


def test_answer_rule_decides_the_halt_and_is_recorded(small_corpus, params, queries):  # noqa: F811
    # docs/definitions.md §3 (the default rule): "Answer:" alone is no final answer, so the trajectory ends in
    # parse_error and the reply reaches Z_answer only as the bare reply; lenient reads an answer.
    (spec,) = run(ScriptedBackend(["Answer: Acme"]), small_corpus, params, queries[:1])
    assert (spec.halted_reason, spec.answer, spec.answer_rule) == ("parse_error", None, "spec")
    lenient = params.agent.model_copy(update={"answer_rule": "lenient"})
    (read,) = run(ScriptedBackend(["Answer: Acme"]), small_corpus, params, queries[:1], config=lenient)
    assert (read.halted_reason, read.answer, read.answer_rule) == ("final_answer", "Acme", "lenient")


def test_observations_go_back_to_the_model_as_user_turns(small_corpus, params, queries):  # noqa: F811
    seen = []

    class Recording(ScriptedBackend):
        def generate(self, conversations, *, stop, max_new_tokens, **_):
            seen.extend(conversations)
            return super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)

    run(Recording(["Action: search_wiki[Ann]", "Final Answer: x"]), small_corpus, params, queries[:1])
    second = seen[1]
    assert second[-2] == {"role": "assistant", "content": "Action: search_wiki[Ann]"}
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith("Observation: ")


def test_halted_reasons(small_corpus, params, queries):  # noqa: F811
    (no_format,) = run(ScriptedBackend(["It is 1990."]), small_corpus, params, queries[:1])
    assert no_format.halted_reason == "parse_error" and no_format.answer is None
    assert no_format.raw_reply == "It is 1990." and no_format.steps[0].thought is None

    (looping,) = run(ScriptedBackend(["Action: search_wiki[Ann]"]), small_corpus, params, queries[:1])
    assert looping.halted_reason == "max_iters" and len(looping.steps) == params.agent.max_iters

    (broken,) = run(ScriptedBackend(["Action: hack[it]"]), small_corpus, params, queries[:1])
    assert broken.halted_reason == "tool_fallback"
    assert len(broken.steps) == params.agent.max_consecutive_tool_errors
    assert "unknown tool" in broken.steps[-1].observation

    (empty,) = run(ScriptedBackend([""]), small_corpus, params, queries[:1])
    assert empty.halted_reason == "parse_error" and empty.raw_reply == ""


def test_a_good_call_resets_the_tool_error_count(small_corpus, params, queries):  # noqa: F811
    replies = ["Action: hack[it]", "Action: search_wiki[Ann]", "Action: hack[it]", "Final Answer: x"]
    (record,) = run(ScriptedBackend(replies), small_corpus, params, queries[:1])
    assert record.halted_reason == "final_answer"


def test_lockstep_batches_shrink_as_trajectories_finish(small_corpus, params, queries):  # noqa: F811
    class Staggered(ScriptedBackend):
        def generate(self, conversations, *, stop, max_new_tokens, **_):
            if not stop:
                return super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)
            self.step_calls.append(len(conversations))
            # the trajectory of the k-th query answers after k tool calls
            return [
                Generation("Final Answer: x" if sum(m["role"] == "assistant" for m in c) >= int(
                    c[1]["content"].endswith(queries[1].question)) + 2 * int(c[1]["content"].endswith(queries[2].question))
                    else "Action: search_wiki[a]")
                for c in conversations
            ]

    backend = Staggered([])
    backend.step_calls = []
    config = params.agent.model_copy(update={"batch_size": 3})
    records = run(backend, small_corpus, params, queries, config=config)
    # q0..q2 start together; q0 answers at once and q3 takes its seat; q3 and q1 answer next;
    # q2 runs alone. The three finished together are summarised in one call, q2 in another.
    assert backend.step_calls == [3, 3, 1]
    assert backend.calls == [3, 1]
    assert sorted(r.query_id for r in records) == sorted(q.query_id for q in queries)
    assert all(r.halted_reason == "final_answer" for r in records)


def test_summary_failure_is_recorded(small_corpus, params, queries):  # noqa: F811
    class FailingSummary(ScriptedBackend):
        def generate(self, conversations, *, stop, max_new_tokens, **_):
            if not stop:
                raise ConnectionError("endpoint went away")
            return super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)

    (record,) = run(FailingSummary(["Final Answer: x"]), small_corpus, params, queries[:1])
    assert record.summary is None and record.summary_error == "ConnectionError: endpoint went away"


def test_reasoning_from_the_endpoint_is_recorded_as_thought(small_corpus, params, queries):  # noqa: F811
    class Reasoning(ScriptedBackend):
        def generate(self, conversations, *, stop, max_new_tokens, **_):
            return [Generation(g.text, "hidden reasoning") if stop else g
                    for g in super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)]

    (record,) = run(Reasoning(["Thought: visible\nFinal Answer: x"]), small_corpus, params, queries[:1])
    assert record.steps[0].thought == "hidden reasoning\nvisible"


@pytest.fixture
def spy_method():
    calls = {"weights": 0, "input": 0, "forward": 0, "output": 0}

    @register_method("spy", substrates=ALL_SUBSTRATES, hooks=frozenset({"input", "forward", "output"}))
    class Spy(Method):
        def rewrite_input(self, query, conversation):
            calls["input"] += 1
            return conversation

        @contextmanager
        def forward_hooks(self, backend, queries):
            calls["forward"] += 1
            yield

        def filter_output(self, query, text):
            calls["output"] += 1
            return text.replace("SECRET", "[redacted]")

    yield calls
    unregister_method("spy")


def test_the_harness_calls_the_declared_hooks(small_corpus, params, queries, spy_method):  # noqa: F811
    records = run(ScriptedBackend(["Thought: SECRET\nFinal Answer: SECRET"], summary="SECRET"),
                  small_corpus, params, queries[:2], method="spy")
    assert spy_method["input"] == 4 and spy_method["output"] == 4  # 2 steps + 2 summaries
    assert spy_method["forward"] == 2  # one batched step call, one batched summary call
    assert all(r.answer == "[redacted]" and r.summary == "[redacted]" for r in records)
    assert all("SECRET" not in r.raw_reply for r in records)


def test_method_declarations_are_checked():
    with pytest.raises(MethodError, match="declares hooks"):
        @register_method("liar", substrates=ALL_SUBSTRATES, hooks=frozenset({"weights"}))
        class Liar(Method):
            pass
    with pytest.raises(MethodError, match="unknown substrate"):
        @register_method("lost", substrates=frozenset({"Q"}))
        class Lost(Method):
            pass


def test_weight_methods_refuse_a_backend_without_weights(small_corpus, params):  # noqa: F811
    @register_method("editor", substrates=frozenset({"P"}), hooks=frozenset({"weights"}))
    class Editor(Method):
        def edit_weights(self, backend):
            raise AssertionError("never reached")

    try:
        editor = build_method("editor", MethodContext(small_corpus, params, 0))
        with pytest.raises(MethodError, match="need model weights"):
            editor.check_deployable("P", ScriptedBackend([]))
        with pytest.raises(MethodError, match="cannot act on substrate 'C'"):
            editor.check_deployable("C", ScriptedBackend([]))
        build_method("none", MethodContext(small_corpus, params, 0)).check_deployable("C", ScriptedBackend([]))
    finally:
        unregister_method("editor")


def test_a_cut_observation_is_marked_in_the_record_and_an_uncut_one_is_not(small_corpus, params, queries):  # noqa: F811
    config = params.agent.model_copy(update={"max_observation_chars": 100})
    huge = "x" * 5000
    backend = ScriptedBackend([f"Thought: look.\nAction: lookup_record[{huge}, employer]",
                               "Thought: again.\nAction: lookup_record[Nobody, employer]", "Final Answer: no"])
    record = run(backend, small_corpus, params, queries[:1], config=config)[0]
    cut, uncut = record.steps[0], record.steps[1]
    assert cut.observation.endswith(f"[... {cut.observation_cut} characters cut]") and len(cut.observation) < 200
    assert cut.observation_cut == len(f"No record found for '{huge}'.") - 100
    assert uncut.observation_cut is None and "observation_cut" not in uncut.model_dump_json()
    assert '"observation_cut":' in record.model_dump_json()


def test_each_record_is_handed_on_in_the_step_its_trajectory_halts(small_corpus, params, queries):  # noqa: F811
    """Batch 16, four queries: the one that halts first is recorded before the others finish,
    and one full summary call covered every query."""
    order = []

    class Tracking(ScriptedBackend):
        def generate(self, conversations, *, stop, max_new_tokens, **kw):
            order.append(("summary" if not stop else "step", len(conversations)))
            return super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)

    backend = Tracking(["Thought: look.\nAction: lookup_record[Nobody, employer]", "Final Answer: no"])
    first = "Final Answer: at once"
    substrate = build_substrate("R-struct", small_corpus, params.agent, seed=0)
    agent = ReActAgent(backend, substrate, build_method("none", MethodContext(small_corpus, params, 0)),
                       params.agent, seed=0)
    seen = []
    agent.advance_original = agent.advance

    def advance(trajectory, generation):  # the first query answers at its first step
        if trajectory.query == queries[0] and not trajectory.steps:
            generation = Generation(first)
        agent.advance_original(trajectory, generation)

    agent.advance = advance
    agent.run([(q, "forget") for q in queries], lambda r: seen.append((r.query_id, len(order))))
    assert seen[0] == (queries[0].query_id, 2)  # step 1, then one summary call: recorded at once
    assert order[:2] == [("step", 4), ("summary", 4)]  # the summary batch took every query
    assert [kind for kind, _ in order].count("summary") == 1
    assert {q for q, _ in seen} == {q.query_id for q in queries}


def test_trajectories_started_on_other_substrates_share_one_step(small_corpus, params, queries):  # noqa: F811
    # The agent base's held-out evaluation steps its C and R-struct trajectories in one batch.
    query = queries[0]
    name = small_corpus.entities[query.entity_id].name
    backend = ScriptedBackend([f"Action: lookup_record[{name}, {query.field}]", "Final Answer: x"])
    method = build_method("none", MethodContext(small_corpus, params, 0))
    agents = [ReActAgent(backend, build_substrate(s, small_corpus, params.agent, seed=0), method, params.agent, seed=0)
              for s in ("C", "R-struct")]
    trajectories = [agent.start(query, "forget") for agent in agents]
    agents[0].step_batch(trajectories)
    assert backend.calls == [2]
    on_c, on_struct = (t.steps[0].observation for t in trajectories)
    assert on_struct == f"{name}'s {FIELD_PHRASES[query.field]}: {query.ground_truth}"  # its own tools
    assert on_c != on_struct
