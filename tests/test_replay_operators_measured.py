"""Every operator does its own work (docs/replay.md, "What the lane must show"): the memory notes
are read by the model at every turn, so B1 differs from B0 where a note holds z; B8 blocks
tool calls and memory writes that carry z and lets free text flow; B9 runs its own replay; an
operator's transitions and tokens are what the runtime ran. A broken operator, registered for
one test only, makes the scorer's check that it would pass by construction fail."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from _agent_fixtures import small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from test_replay_runtime import _run, scripted  # noqa: F401  (the scripted agent and its fixture)

from kbench.config import AgentConfig
from kbench.replay import SessionEnvironment, plan_suite
from kbench.replay.operators import Branch, Operator, OperatorContext, operator_class, register_operator, \
    unregister_operator
from kbench.replay.provenance import ProvenanceGraph
from kbench.replay.records import SessionRecord
from kbench.replay.run import run_session
from kbench.replay.runtime import MEMORY_HEADER, SUMMARY_REQUEST
from kbench.replay.scoring import leaks, score_sessions


@contextmanager
def registered_instead(operator: str, cls: type[Operator]) -> Iterator[None]:
    """`cls` runs under `operator`'s id for the block; the real operator is registered again after it."""
    real = operator_class(operator)
    unregister_operator(operator)
    register_operator(operator, real.title)(cls)
    try:
        yield
    finally:
        unregister_operator(operator)
        register_operator(operator, real.title)(real)


def _tool_leak(record: SessionRecord) -> bool:
    """Some post-revocation tool call's arguments carry z."""
    return any(leaks(record, str(value)) for turn in record.post for call in turn.tool_calls
               for value in call.args.values())


# -- B7: transitions and tokens are measured ---------------------------------------------------

class EarlySelectiveReplay(Operator):
    """B7 broken: restores the checkpoint of turn τ − 1 and claims the bound's transitions."""

    def apply(self, context: OperatorContext) -> Branch:
        runtime = context.runtime
        snapshot = runtime.restore_point(context.tau - 1)  # one turn early
        start = snapshot.turns_run + 1
        before = context.contaminated.graph
        graph = ProvenanceGraph({k: a for k, a in before.artifacts.items() if a.turn < start},
                                [c for c in before.checkpoints if c.turn < start])
        state = runtime.restore(snapshot, context.sanitized_env(snapshot=snapshot.checkpoint.environment), graph)
        runtime.run_session_turns(state, start, sanitized=True, shadow=True, call_prefix=context.plan.session_id)
        return Branch(state, transitions=context.plan.T - context.tau + 1)  # a formula: the driver measures instead


def test_b7_replaying_from_one_turn_early_fails_the_bound_check(scripted, small_corpus):  # noqa: F811
    operators = ("B0", "B5", "B7")
    plan, good = _run(scripted, small_corpus, "tool", operators=operators)
    scores = score_sessions(good.records)[plan.suite]
    b7 = {r.operator: r for r in good.records}["B7"]
    assert b7.transitions == plan.T - plan.tau + 1
    assert scores.b7_transitions_at_bound.at_bound == 1 and scores.b7_equals_b5.equal == 1
    with registered_instead("B7", EarlySelectiveReplay):
        _, broken = _run(scripted, small_corpus, "tool", operators=operators)
    early = {r.operator: r for r in broken.records}["B7"]
    assert early.transitions == plan.T - plan.tau + 2  # what the runtime ran, not what apply claimed
    assert early.recomputed_tokens > b7.recomputed_tokens
    assert score_sessions(broken.records)[plan.suite].b7_transitions_at_bound.at_bound == 0


def test_no_operator_states_its_own_cost(scripted, small_corpus):  # noqa: F811
    """B0..B4, B6 and B8 run no agent turn; B5 and B5' run T, B7 and B9 T − τ + 1, each its own."""
    plan, result = _run(scripted, small_corpus, "tool")
    by = {r.operator: r.transitions for r in result.records}
    assert by == {"B0": 0, "B1": 0, "B2": 0, "B3": 0, "B4": 0, "B5": plan.T, "B5'": plan.T, "B6": 0,
                  "B7": plan.T - plan.tau + 1, "B8": 0, "B9": plan.T - plan.tau + 1}


class CopiedReplayThenFlowControl(Operator):
    """B9 broken: B7's branch copied instead of a replay of its own."""

    def apply(self, context: OperatorContext) -> Branch:
        return Branch(context.branch("B7").state.fork())


def test_b9_copying_b7s_branch_runs_nothing_and_shows_it(scripted, small_corpus):  # noqa: F811
    operators = ("B0", "B5", "B7", "B9")
    plan, good = _run(scripted, small_corpus, "tool", operators=operators)
    by = {r.operator: r for r in good.records}
    assert by["B9"].transitions == by["B7"].transitions == plan.T - plan.tau + 1
    assert by["B9"].recomputed_tokens == by["B7"].recomputed_tokens > 0
    with registered_instead("B9", CopiedReplayThenFlowControl):
        _, broken = _run(scripted, small_corpus, "tool", operators=operators)
    copied = {r.operator: r for r in broken.records}["B9"]
    assert copied.transitions == copied.recomputed_tokens == 0
    with registered_instead("B9", CopiedReplayThenFlowControl):  # B7 computed inside B9's apply: B7's cost, not B9's
        _, inside = _run(scripted, small_corpus, "tool", operators=("B0", "B5", "B9", "B7"))
    found = {r.operator: r for r in inside.records}
    assert found["B9"].transitions == 0 and found["B7"].transitions == plan.T - plan.tau + 1


# -- B1: the notes are read, and deleted -------------------------------------------------------

def _memory_session(backend, corpus, operators):  # noqa: ANN001, ANN202
    """A memory session in which z reaches the later turns through the note only: the user's
    message and the remember call are compressed away after turn τ by a summary that keeps no
    fact, and the turns after τ are about other people."""
    (plan,) = plan_suite(corpus, sessions=1, kind="memory", T=5, tau=3, indep=1.0, n_post=4, seed=0)
    env = SessionEnvironment(corpus, source=(plan.target_entity, plan.target_field))
    return plan, run_session(backend, env, plan, AgentConfig(max_iters=4), operators=operators,
                             compression_period=plan.tau)


@pytest.fixture
def forgetful_summaries(monkeypatch):  # noqa: ANN001, ANN201
    module = sys.modules["test_replay_runtime"]
    real = module.reply

    def reply(conversation):  # noqa: ANN001, ANN202
        if conversation[-1]["content"] == SUMMARY_REQUEST:
            return "Summary: the user asked about some people."
        return real(conversation)

    monkeypatch.setattr(module, "reply", reply)


class KeepingMemoryDelete(Operator):
    """B1 broken: deletes nothing."""

    def apply(self, context: OperatorContext) -> Branch:
        return Branch(context.contaminated.fork())


def test_the_model_reads_its_notes_and_b1_deletes_them(scripted, small_corpus, forgetful_summaries):  # noqa: F811
    operators = ("B0", "B1", "B5")
    plan, result = _memory_session(scripted, small_corpus, operators)
    by = {r.operator: r for r in result.records}
    scores = score_sessions(result.records)[plan.suite]
    # B0 leaks through the note alone: its memory block is the only text of the prompt that holds z
    assert scores.operators["B0"].exact == 1.0 and scores.operators["B1"].exact == 0.0
    assert scores.b1_equals_b0.equal == 0 and by["B1"].recomputed_tokens > 0 and by["B1"].transitions == 0
    with registered_instead("B1", KeepingMemoryDelete):
        _, broken = _memory_session(scripted, small_corpus, operators)
    broken_scores = score_sessions(broken.records)[plan.suite]
    assert broken_scores.operators["B1"].exact == 1.0 and broken_scores.b1_equals_b0.equal == 1


def test_each_turn_opens_with_the_memory_block_and_keeps_the_cache_prefix(scripted, small_corpus,  # noqa: F811
                                                                          monkeypatch):
    """The notes are read at the head of every turn after the note was written, and no prompt
    token the engine computed before is computed again: each step's prompt starts with the last one."""
    from kbench.backends.engine import common_prefix
    from kbench.replay.runtime import SessionRuntime

    (plan,) = plan_suite(small_corpus, sessions=1, kind="memory", T=5, tau=3, indep=1.0, n_post=4, seed=0)
    runtime = SessionRuntime(scripted, plan, AgentConfig(max_iters=4), compression_period=0)
    state = runtime.fresh_state(SessionEnvironment(small_corpus, source=(plan.target_entity, plan.target_field)))
    last: list[list[int]] = []
    real = scripted.feed

    def feed(kv, prompt, reply):  # noqa: ANN001, ANN202
        if kv is state.kv:
            assert not last or common_prefix(last[-1], prompt) == len(last[-1])  # the earlier prompt is kept
            last.append(list(prompt))
        real(kv, prompt, reply)

    monkeypatch.setattr(scripted, "feed", feed)
    runtime.run_session_turns(state, 1, sanitized=False, shadow=False, call_prefix=plan.session_id)
    assert len(last) > plan.T
    messages = [m["content"] for m in state.conversation(4) if m["role"] == "user"]
    opened = [m for m in messages if m.startswith(MEMORY_HEADER)]
    assert len(opened) == plan.T - plan.tau and all(plan.target in m for m in opened)  # each turn after τ
    assert state.env.tool_lines()[-2].endswith("your notes are shown to you at the start of every later turn.")


# -- B8: tool calls and memory writes are sinks, free text is not --------------------------------

class OpenFlowControl(Operator):
    """B8 broken: its policy blocks nothing."""

    def apply(self, context: OperatorContext) -> Branch:
        return Branch(context.contaminated.fork(), policy=lambda state, tool, args: False)


def test_b8_blocks_calls_that_carry_z_and_one_that_blocks_nothing_lets_them_pass(scripted, small_corpus):  # noqa: F811
    operators = ("B0", "B5", "B8")
    plan, good = _run(scripted, small_corpus, "tool", operators=operators)
    b0, b8 = ({r.operator: r for r in good.records}[o] for o in ("B0", "B8"))
    assert _tool_leak(b0) and not _tool_leak(b8)
    assert b8.blocked_calls and all(leaks(b8, str(c.args)) for c in b8.blocked_calls)
    assert {c.tool for c in b8.blocked_calls} == {"send_message"}
    assert any(leaks(b8, t.answer) for t in b8.post)  # an answer is free text: it flows
    with registered_instead("B8", OpenFlowControl):
        _, broken = _run(scripted, small_corpus, "tool", operators=operators)
    open_b8 = {r.operator: r for r in broken.records}["B8"]
    assert open_b8.blocked_calls == [] and _tool_leak(open_b8)


def test_b8_blocks_a_memory_write_that_carries_z(scripted, small_corpus, monkeypatch):  # noqa: F811
    """A post-revocation turn that has the agent remember z: B8 keeps the write out of
    `memory_writes` and the store; B0 writes it."""
    plan, _ = _run(scripted, small_corpus, "tool", operators=("B0", "B5"))
    remember = dataclasses.replace(plan.post[1], user=f"Please remember this for later: {plan.probes['cued']} "
                                   f"{plan.target}.".replace("Complete the sentence: ", ""))
    import kbench.replay.sessions as sessions

    real = sessions.plan_suite

    def with_remember(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return [dataclasses.replace(p, post=(p.post[0], remember, *p.post[2:])) for p in real(*args, **kwargs)]

    monkeypatch.setattr(sys.modules["test_replay_runtime"], "plan_suite", with_remember)
    _, result = _run(scripted, small_corpus, "tool", operators=("B0", "B5", "B8"))
    by = {r.operator: r for r in result.records}
    written = [w for t in by["B0"].post for w in t.memory_writes]
    assert written and any(plan.target in w for w in written)
    assert not any(plan.target in w for t in by["B8"].post for w in t.memory_writes)
    assert any(c.tool == "remember" and plan.target in c.args["note"] for c in by["B8"].blocked_calls)
