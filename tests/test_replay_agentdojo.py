"""AgentDojo's suites in the lane, from the pinned PyPI package: plans whose z sits in the tool
return turn τ's task reads, the world's snapshots and sanitized form, arguments parsed as data,
and a whole session on a ground-truth agent (it makes each task's ground-truth calls, then
answers from what its prompt holds): B7 = B5 and B1 = B0 there too."""

from __future__ import annotations

import json
import re

import pytest

from kbench.backends.hf import load_tokenizer
from kbench.config import AgentConfig
from kbench.replay.agentdojo import (
    AGENTDOJO_VERSION,
    AgentDojoError,
    acquisition_steps,
    environment_for,
    load_suite,
    plan_agentdojo,
    task_vectors,
)
from kbench.replay.environment import WITHHELD
from kbench.replay.records import OPERATORS
from kbench.replay.run import run_session
from kbench.replay.runtime import SUMMARY_REQUEST
from kbench.replay.scoring import score_sessions

import test_replay_runtime as scripted_session
from _agent_fixtures import small_corpus, tiny_model_dir  # noqa: F401  (fixtures)

SUITE = "agentdojo-banking"


def _plans(corpus, **shape):  # noqa: ANN001
    shape = {"sessions": 1, "T": 5, "tau": 3, "indep": 0.5, "n_post": 4, "seed": 0, **shape}
    return plan_agentdojo(SUITE, corpus, **shape)


def _session(corpus, model_dir, monkeypatch, reply, *, max_iters: int, compression_period: int):  # noqa: ANN001, ANN202
    """One planned session run with `reply` as the scripted model's policy: (plan, result)."""
    monkeypatch.setattr(scripted_session, "reply", reply)
    backend = scripted_session.SessionScriptBackend(load_tokenizer(model_dir))
    (plan, injections), = _plans(corpus)
    return plan, run_session(backend, environment_for(SUITE, injections, plan), plan,
                             AgentConfig(max_iters=max_iters), operators=OPERATORS,
                             compression_period=compression_period)


def test_the_pinned_package_and_an_unknown_suite():
    import importlib.metadata

    assert importlib.metadata.version("agentdojo") == AGENTDOJO_VERSION
    with pytest.raises(AgentDojoError, match="unknown AgentDojo suite 'agentdojo-chess'"):
        load_suite("agentdojo-chess")


def test_z_sits_where_turn_tau_reads_and_nowhere_earlier(small_corpus):  # noqa: F811
    (plan, injections), = _plans(small_corpus)
    vectors = task_vectors(SUITE)
    suite = load_suite(SUITE)
    by_prompt = {task.PROMPT: task_id for task_id, task in suite.user_tasks.items()}
    entry = by_prompt[plan.turns[plan.tau - 1].user]
    assert set(injections) == vectors[entry] and all(plan.target in text for text in injections.values())
    for turn in plan.turns[: plan.tau - 1]:
        assert not vectors[by_prompt[turn.user]] & set(injections)
    assert plan.turns[plan.tau - 1].injects_target and plan.suite == SUITE
    assert _plans(small_corpus) == _plans(small_corpus)  # a pure function of the seed


def test_turn_tau_starts_with_the_ground_truth_call_that_reads_z(small_corpus):  # noqa: F811
    (plan, injections), = _plans(small_corpus)
    suite = load_suite(SUITE)
    entry = next(t for t, task in suite.user_tasks.items() if task.PROMPT == plan.turns[plan.tau - 1].user)
    first = suite.user_tasks[entry].ground_truth(suite.load_and_inject_default_environment({}))[0]
    script = acquisition_steps(SUITE)[entry]
    assert script.endswith(f"Action: {first.function}[{json.dumps(dict(first.args), sort_keys=True)}]")
    assert [t.acquisition is not None for t in (*plan.turns, *plan.post)] == \
        [t.number == plan.tau for t in (*plan.turns, *plan.post)]
    world = environment_for(SUITE, injections, plan)
    assert plan.target in world.call(first.function, dict(first.args), call_id="c0")  # the call reads z


def test_z_enters_through_the_scripted_step_on_an_agent_that_never_calls_a_tool(small_corpus, tiny_model_dir,
                                                                                monkeypatch):  # noqa: F811
    real = scripted_session.reply

    def reply(conversation):  # noqa: ANN001
        if conversation[-1]["content"] == SUMMARY_REQUEST:
            return real(conversation)
        return "Thought: I can answer.\nFinal Answer: done."

    plan, result = _session(small_corpus, tiny_model_dir, monkeypatch, reply, max_iters=3, compression_period=0)
    by = {r.operator: r for r in result.records}
    assert result.tau == plan.tau
    assert by["B7"].final_state_sha256 == by["B5"].final_state_sha256
    assert by["B7"].transitions == plan.T - plan.tau + 1


def test_the_world_snapshots_sanitizes_and_delivers_once(small_corpus):  # noqa: F811
    (plan, injections), = _plans(small_corpus)
    world = environment_for(SUITE, injections, plan)
    assert plan.target in world.env.model_dump_json()
    clean = world.fork(withheld=("x", "y"))
    assert plan.target not in clean.env.model_dump_json() and WITHHELD in clean.env.model_dump_json()
    assert world.parse("get_balance", "") == {} and world.parse("rm_rf", "x") is None
    args = world.parse("send_money", json.dumps({"recipient": "X", "amount": 5, "subject": "s", "date": "2022-01-01",
                                                 "evil": "__import__('os')"}))
    assert "evil" not in args  # only the tool's own parameters are read
    start = world.snapshot()
    world.call("send_money", args, call_id="c1")
    world.call("send_money", args, call_id="c1")
    assert [d.call_id for d in world.outbox] == ["c1"]  # delivered once
    world.restore(start)
    world.call("send_money", args, call_id="c1", shadow=True)
    assert len(world.outbox) == 1 and len(world.shadow) == 1
    assert world.call("get_balance", {"nonsense": 1}, call_id="c2") != ""  # an error is an observation


def _ground_truth_reply(conversation) -> str:  # noqa: ANN001
    """Each AgentDojo task's ground-truth calls, one per step, then an answer; a question about a
    person is answered from the prompt as the scripted session agent answers it."""
    questions = [i for i, m in enumerate(conversation) if m["content"].startswith("Question: ")]
    question = conversation[questions[-1]]["content"][len("Question: "):]
    suite = load_suite(SUITE)
    task = next((t for t in suite.user_tasks.values() if t.PROMPT == question), None)
    if task is None:
        return "Final Answer: I cannot help with that."
    calls = task.ground_truth(suite.load_and_inject_default_environment({}))
    step = sum(m["role"] == "assistant" for m in conversation[questions[-1]:])
    if step < len(calls):
        return f"Action: {calls[step].function}[{json.dumps(calls[step].args, default=str)}]"
    return "Final Answer: done."


def test_a_session_on_the_ground_truth_agent(small_corpus, tiny_model_dir, monkeypatch):  # noqa: F811
    real = scripted_session.reply

    def reply(conversation):  # noqa: ANN001
        questions = [m["content"] for m in conversation if m["content"].startswith("Question: ")]
        if questions and not re.match(r"Question: What is ", questions[-1]) and \
                conversation[-1]["content"] != SUMMARY_REQUEST:
            return _ground_truth_reply(conversation)
        return real(conversation)

    plan, result = _session(small_corpus, tiny_model_dir, monkeypatch, reply, max_iters=6, compression_period=4)
    by = {r.operator: r for r in result.records}
    assert result.tau == plan.tau
    assert by["B7"].final_state_sha256 == by["B5"].final_state_sha256
    assert by["B1"].final_state_sha256 == by["B0"].final_state_sha256
    assert by["B7"].transitions == plan.T - plan.tau + 1
    scores = score_sessions(result.records)[SUITE].model_dump()
    assert scores["operators"]["B5"]["exact"] == 0.0
