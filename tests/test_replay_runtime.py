"""The lane's runtime and operators on a scripted agent: a backend whose reply is a fixed
function of the prompt, with the KV bookkeeping of the engine (tokens held, tokens fed), so
every operator's state can be checked exactly. The scripted agent looks things up, sends and
remembers as asked, and when a lookup says "not on record" it answers from what its prompt
still holds: z resurfaces exactly when the state still carries it."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence

import pytest

from kbench.backends import Backend, Conversation, Generation
from kbench.backends.base import Request
from kbench.backends.engine import EngineStats, KVState, common_prefix
from kbench.backends.hf import EngineSessions, encode_prompt, load_tokenizer
from kbench.config import AgentConfig
from kbench.names import EVERY_TURN, SESSION_START
from kbench.replay import SessionEnvironment, plan_suite
from kbench.replay.operators import OperatorError, build_operator, operator_names
from kbench.replay.records import OPERATORS
from kbench.replay.run import TargetNeverEntered, run_session
from kbench.replay.runtime import BLOCKED, MEMORY_HEADER, SUMMARY_REQUEST
from kbench.replay.scoring import score_sessions

from _agent_fixtures import small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from test_stage_unit import assert_corrupt_inputs_start_over

_FACT = re.compile(r"([A-Z][\w.'-]*(?: [A-Z][\w.'-]*)+)'s ([a-z ]+?)(?::| is) ([^\n]+?)(?:\.$|\.\n|\n|$)", re.M)


class _Engine:
    def __init__(self, backend: SessionScriptBackend) -> None:
        self.backend, self.stats = backend, EngineStats()

    def prefill(self, states: Sequence[KVState], prompts: Sequence[Sequence[int]], *, share_prefixes: bool = True):
        for state, prompt in zip(states, prompts):
            self.backend.feed(state, list(prompt), [])


class SessionScriptBackend(Backend):
    name, has_weights = "session-script", False

    def __init__(self, tokenizer) -> None:  # noqa: ANN001
        self._tokenizer, self.engine = tokenizer, _Engine(self)

    @property
    def tokenizer(self):  # noqa: ANN201
        return self._tokenizer

    def session(self) -> KVState:
        return KVState()

    def kv_sessions(self) -> EngineSessions:
        return EngineSessions(self)  # over `self.engine` and `self.tokenizer`, as the hf backend's

    def feed(self, state: KVState, prompt: list[int], reply: list[int]) -> None:
        self.engine.stats.prefill_tokens += len(prompt) - common_prefix(state.tokens, prompt)
        self.engine.stats.generated_tokens += len(reply)
        state.tokens = prompt + reply

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        out = []
        for i, conversation in enumerate(conversations):
            text = reply(conversation)
            if request.sessions is not None:
                tokens = encode_prompt(self._tokenizer, conversation)
                self.feed(request.sessions[i], tokens, self._tokenizer.encode(text, add_special_tokens=False))
            out.append(Generation(text))
        return out


def _recall(conversation: Conversation, name: str, phrase: str) -> str | None:
    """The last value of name's phrase that the prompt still states (not withheld or redacted)."""
    found = None
    for message in conversation:
        for who, what, value in _FACT.findall(message["content"]):
            if who.endswith(name) and what == phrase and value not in ("not on record", "[redacted]"):
                found = value
    return found


def _body(content: str) -> str:
    """A message without the memory block that opens it (the notes are still in the prompt, for `_recall`)."""
    return content.split("\n\n", 1)[1] if content.startswith(MEMORY_HEADER) else content


def reply(conversation: Conversation) -> str:
    last = _body(conversation[-1]["content"])
    questions = [_body(m["content"]) for m in conversation if _body(m["content"]).startswith("Question: ")]
    if last == SUMMARY_REQUEST:
        facts = [f"{w}'s {p}: {v}" for m in conversation[1:] for w, p, v in _FACT.findall(m["content"])]
        return "Summary: " + "; ".join(facts)
    if last.startswith("Question: "):
        q = last[len("Question: "):]
        if q.startswith("Please remember this for later: "):
            return f"Action: remember[{q[len('Please remember this for later: '):].rstrip('.')}]"
        asked = re.search(r"(?:What is|message with) (.+)'s (.+?)[?.]$", q)
        return f"Thought: look it up.\nAction: lookup_record[{asked[1]}, {asked[2]}]"
    if last.startswith("Observation: "):
        observation, q = last[len("Observation: "):], questions[-1]
        if observation.startswith(("Noted", "Message sent")):
            return "Final Answer: done."
        asked = re.search(r"(?:What is|message with) (.+)'s (.+?)[?.]$", q)
        value = observation.split(": ", 1)[1] if ": " in observation else observation
        if value == "not on record":
            value = _recall(conversation[:-1], asked[1], asked[2]) or value
        if q.startswith("Question: Send "):
            recipient = q.split()[2]
            return f"Action: send_message[{recipient}, {value}]"
        return f"Final Answer: {value}"
    name = re.search(r"about (.+)\.$", last)  # the think probe names the person
    return f"Final Answer: {_recall(conversation, name[1], 'address') if name else 'nothing'}"


@pytest.fixture(scope="module")
def scripted(tiny_model_dir) -> SessionScriptBackend:  # noqa: F811
    return SessionScriptBackend(load_tokenizer(tiny_model_dir))


def _run(backend, corpus, kind: str, *, index: int = 0, operators=OPERATORS, checkpoints=EVERY_TURN,  # noqa: ANN001
         scripted_entry: bool = True):
    (plan,) = plan_suite(corpus, sessions=1, kind=kind, T=6, tau=3, indep=0.5, n_post=4, seed=index)
    if not scripted_entry:  # the model alone must bring z in
        plan = dataclasses.replace(plan, turns=tuple(dataclasses.replace(t, acquisition=None) for t in plan.turns))
    env = SessionEnvironment(corpus, source=(plan.target_entity, plan.target_field))
    return plan, run_session(backend, env, plan, AgentConfig(max_iters=4), operators=operators,
                             compression_period=4, checkpoints=checkpoints)


@pytest.mark.parametrize("kind", ["tool", "memory"])
def test_the_papers_claims_hold_on_the_scripted_agent(scripted, small_corpus, kind):  # noqa: F811
    plan, result = _run(scripted, small_corpus, kind)
    by = {r.operator: r for r in result.records}
    assert list(by) == list(OPERATORS)
    assert result.tau == plan.tau == 3
    assert by["B7"].final_state_sha256 == by["B5"].final_state_sha256  # replay equals the full reset
    assert by["B5'"].final_state_sha256 == by["B5"].final_state_sha256  # so does a reset with a prefix cache
    if kind == "tool":  # no note holds z: B1 has nothing to delete, and runs nothing
        assert by["B1"].final_state_sha256 == by["B0"].final_state_sha256 and by["B1"].recomputed_tokens == 0
    else:  # the note the model reads at every later turn holds z: B1 deletes it and prefills the prompt again
        assert by["B1"].final_state_sha256 != by["B0"].final_state_sha256 and by["B1"].recomputed_tokens > 0
        assert all(plan.target not in w for t in by["B1"].post for w in t.memory_writes)
    assert by["B7"].transitions == plan.T - plan.tau + 1 and by["B5"].transitions == plan.T
    # the prefix cache also reuses what follows τ up to z's first token, so B5' may cost less than B7
    assert 0 < by["B7"].recomputed_tokens < by["B5"].recomputed_tokens
    assert 0 < by["B5'"].recomputed_tokens < by["B5"].recomputed_tokens
    assert by["B0"].transitions == by["B0"].recomputed_tokens == 0
    scores = score_sessions(result.records)[plan.suite].model_dump()
    ops = scores["operators"]
    assert ops["B0"]["exact"] == 1.0 and ops["B5"]["exact"] == 0.0 and ops["B7"]["any"] == 0.0
    b8 = by["B8"]  # a call whose arguments carry z is blocked and kept out of post; free text flows
    assert b8.blocked_calls and {c.turn for c in b8.blocked_calls} <= {t.number for t in plan.post}
    assert all(any(plan.target in leaf for leaf in c.args.values()) for c in b8.blocked_calls)
    assert not any(plan.target in str(c.args) for t in b8.post for c in t.tool_calls)
    assert any(t.answer is not None and plan.target in t.answer for t in b8.post) and ops["B8"]["exact"] == 1.0
    assert BLOCKED not in b8.probes.values()
    assert all(not r.blocked_calls for r in result.records if r.operator != "B8")
    # B9 runs its own replay (the same turns and tokens as B7's, measured), then the policy: nothing left to block
    assert by["B9"].final_state_sha256 == by["B7"].final_state_sha256
    assert (by["B9"].transitions, by["B9"].recomputed_tokens) == (by["B7"].transitions, by["B7"].recomputed_tokens)
    assert result.checkpoint_bytes == 0 and result.checkpoints >= plan.T
    assert result.closures["oracle"] and not result.closures["inferred_only"]


@pytest.mark.parametrize("kind", ["tool", "memory"])
def test_with_a_checkpoint_at_the_start_only_b7_replays_every_turn_and_still_equals_b5(scripted, small_corpus, kind):  # noqa: F811
    """The granularity ablation: B7 then has only the session's start to restore, so it replays
    all T turns, as much work as the full reset, with the same final state and no leak; the
    every-turn run takes more checkpoints and records more metadata for its shorter replay."""
    operators = ("B0", "B5", "B7")
    plan, sparse = _run(scripted, small_corpus, kind, operators=operators, checkpoints=SESSION_START)
    _, dense = _run(scripted, small_corpus, kind, operators=operators)
    by = {r.operator: r for r in sparse.records}
    assert by["B7"].transitions == plan.T and by["B7"].final_state_sha256 == by["B5"].final_state_sha256
    assert by["B7"].recomputed_tokens == by["B5"].recomputed_tokens
    assert score_sessions(sparse.records)[plan.suite].operators["B7"].any == 0.0
    replayed = {r.operator: r for r in dense.records}["B7"]
    assert replayed.transitions == plan.T - plan.tau + 1 < plan.T
    assert replayed.recomputed_tokens < by["B7"].recomputed_tokens
    assert replayed.final_state_sha256 == by["B7"].final_state_sha256  # the same state, whichever checkpoint
    assert sparse.checkpoints < dense.checkpoints and 0 < sparse.checkpoint_metadata_bytes < dense.checkpoint_metadata_bytes


def test_b4_and_b6_remove_z_from_the_prompt_and_b3_keeps_what_was_derived(scripted, small_corpus):  # noqa: F811
    plan, result = _run(scripted, small_corpus, "tool")
    by = {r.operator: r for r in result.records}
    ops = score_sessions(result.records)[plan.suite].model_dump()["operators"]
    assert ops["B4"]["exact"] == 0.0 and ops["B6"]["exact"] == 0.0
    assert by["B3"].recomputed_tokens > 0 and by["B6"].recomputed_tokens > 0


def test_a_replayed_send_leaves_once(scripted, small_corpus):  # noqa: F811
    """The contaminated run sends z; the replays (B5, B5', B7) send nothing new: their sends are
    shadow-executed under the original call ids."""
    from kbench.replay.operators import OperatorContext
    from kbench.replay.runtime import SessionRuntime

    for index in range(6):
        (plan,) = plan_suite(small_corpus, sessions=1, kind="tool", T=6, tau=2, indep=0.0, n_post=4, seed=index)
        if any(t.consequential for t in plan.turns[plan.tau:]):
            break
    runtime = SessionRuntime(scripted, plan, AgentConfig(max_iters=4), compression_period=0)
    state = runtime.fresh_state(SessionEnvironment(small_corpus, source=(plan.target_entity, plan.target_field)))
    runtime.run_session_turns(state, 1, sanitized=False, shadow=False, call_prefix=plan.session_id, record=True)
    sent = list(state.env.outbox)
    assert sent and any(plan.target in d.text for d in sent)
    closure = frozenset(state.graph.taint_closure(plan.source_id))
    context = OperatorContext(runtime, state, source=plan.source_id, tau=plan.tau, closure=closure,
                              branch_of=lambda name: build_operator(name).apply(context))
    replayed = build_operator("B7").apply(context)
    assert replayed.state.env.outbox == sent  # nothing new left the session
    assert [d.call_id for d in replayed.state.env.shadow] == [d.call_id for d in sent]
    assert all(plan.target not in d.text for d in replayed.state.env.shadow)


def test_z_enters_through_the_scripted_lookup_on_an_agent_that_never_calls_a_tool(scripted, small_corpus,  # noqa: F811
                                                                                 monkeypatch):
    real = reply

    def reply_no_call(conversation):  # noqa: ANN001
        return real(conversation) if conversation[-1]["content"] == SUMMARY_REQUEST else "Final Answer: done."

    monkeypatch.setattr(sys.modules[__name__], "reply", reply_no_call)
    plan, result = _run(scripted, small_corpus, "tool")
    by = {r.operator: r for r in result.records}
    assert result.tau == plan.tau
    assert by["B7"].final_state_sha256 == by["B5"].final_state_sha256
    assert by["B7"].transitions == plan.T - plan.tau + 1


def test_a_session_whose_z_never_enters_is_named(scripted, small_corpus, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sys.modules[__name__], "reply", lambda conversation: "Final Answer: I will not look.")
    with pytest.raises(TargetNeverEntered, match="z never entered the state"):
        _run(scripted, small_corpus, "tool", scripted_entry=False)


def test_unknown_operators_are_answered_with_the_registered_ones():
    assert operator_names() == list(OPERATORS)
    with pytest.raises(OperatorError, match=r"unknown operator 'B42'; registered: \['B0'"):
        build_operator("B42")


def test_the_suites_scores_list_sessions_in_plan_order_whatever_order_they_finish(small_corpus, tiny_model_dir,  # noqa: F811
                                                                                 kbench_root, monkeypatch):
    import json

    import kbench.stages.replay as stage
    from kbench.config import Params
    from kbench.corpus import write_corpus

    corpus_dir = kbench_root / "corpus"
    write_corpus(small_corpus, corpus_dir)
    params = Params.model_validate({"agent_base": {"out_dir": str(tiny_model_dir)}, "execution": {"cell_workers": 1},
                                    "replay": {"suites": ["kbench-sessions"], "sessions": 3}})

    def backwards(task, jobs, workers, finished):  # the last session finishes first  # noqa: ANN001, ANN202
        for job in reversed(jobs):
            finished(job, f"session {job.index}: z never entered", 1.0)
        return []

    monkeypatch.setattr(stage, "run_items", backwards)
    assert stage.main(params, stage.Options(corpus=corpus_dir)) == 0
    out = kbench_root / "artifacts/replay/kbench-sessions"
    missing = json.loads((out / "scores.json").read_text())["not_entered"]
    assert missing == list(json.loads((out / "sessions.json").read_text())) and len(missing) == 3
    assert missing == sorted(missing)


def test_the_stage_writes_records_scores_and_traces_and_resumes(scripted, small_corpus, tiny_model_dir,  # noqa: F811
                                                               kbench_root, monkeypatch, caplog):
    import json

    import mlflow

    import kbench.stages.replay as stage
    from kbench.config import Params
    from kbench.corpus import write_corpus
    from kbench.replay.records import read_sessions

    corpus_dir = kbench_root / "corpus"
    write_corpus(small_corpus, corpus_dir)
    params = Params.model_validate({"agent_base": {"out_dir": str(tiny_model_dir)}, "execution": {"cell_workers": 1},
                                    "replay": {"suites": ["kbench-sessions"], "sessions": 2, "max_iters": 4,
                                               "T": 6, "tau": 3, "compression_period": 4}})
    monkeypatch.setattr(stage, "worker_backend", lambda model: scripted)
    monkeypatch.setattr(stage, "worker_corpus", lambda folder: small_corpus)
    options = stage.Options(corpus=corpus_dir)
    assert stage.main(params, options) == 0
    out = kbench_root / "artifacts/replay/kbench-sessions"
    records = read_sessions([out / "sessions.jsonl"])
    assert len(records) == 2 * len(OPERATORS)
    scores = json.loads((out / "scores.json").read_text())
    assert scores["valid"] and scores["b7_equals_b5"]["equal"] == 2 and scores["not_entered"] == []
    assert scores["channels"]["B0"]["turns"] == 2 * 4 and scores["channels"]["B0"]["Z_answer"] > 0
    assert scores["channels"]["B5"]["Z_answer"] == 0.0
    info = json.loads((out / "sessions.json").read_text())
    assert all(item["entered"] and item["checkpoint_bytes"] == 0 for item in info.values())
    page = (kbench_root / "docs/results-replay.md").read_text()
    assert "| B7 |" in page and "| kbench-sessions | 2 | yes | 2/2 | 2/2 | 2/2 |" in page
    traces = mlflow.search_traces(locations=[mlflow.get_experiment_by_name(params.tracking.experiment).experiment_id],
                                  return_type="list")
    assert len(traces) == 2

    # A rerun keeps both sessions; with one session's record lost it runs that one again, to the same records.
    def without_seconds(rows):
        return [r.model_dump(exclude={"seconds"}) for r in rows]

    calls = []
    monkeypatch.setattr(stage, "run_session", lambda *a, **k: calls.append(1) or stage_run_session(*a, **k))
    stage_run_session = __import__("kbench.replay.run", fromlist=["run_session"]).run_session
    assert stage.main(params, options) == 0 and calls == []
    last = records[-1].session_id
    (out / "sessions.json").write_text(json.dumps({k: v for k, v in info.items() if k != last}))
    (out / "sessions.jsonl").write_text("".join(line + "\n" for line in (out / "sessions.jsonl").read_text()
                                                .splitlines() if last not in line))
    assert stage.main(params, options) == 0 and calls == [1]
    assert without_seconds(read_sessions([out / "sessions.jsonl"])) == without_seconds(records)
    # A corrupt inputs.json: one warning line naming it, and the suite starts over (every lane alike).
    assert_corrupt_inputs_start_over(out, lambda: stage.main(params, options), caplog)
    assert calls == [1, 1, 1] and without_seconds(read_sessions([out / "sessions.jsonl"])) == without_seconds(records)


def test_a_design_without_suites_writes_the_page_dvc_expects(kbench_root):
    import kbench.stages.replay as stage
    from kbench.config import Params

    params = Params.model_validate({"replay": {"suites": []}})
    assert stage.main(params, stage.Options()) == 0
    page = (kbench_root / params.replay.results).read_text()
    assert page.startswith("# Execution-state lane") and "`replay.suites` is empty" in page
    assert (kbench_root / params.replay.out_dir).is_dir()


def test_the_stage_names_an_unknown_suite_or_operator(tiny_model_dir):  # noqa: F811
    import kbench.stages.replay as stage
    from kbench.config import Params

    with pytest.raises(ValueError, match=r"unknown suite 'nope'; registered: \['kbench-sessions'"):
        stage.check_design(Params(), ["nope"])
    with pytest.raises(ValueError, match="unknown operator 'B42'"):
        stage.check_design(Params.model_validate({"replay": {"operators": ["B0", "B42", "B5"]}}), ["kbench-sessions"])
    with pytest.raises(ValueError, match="must include B5"):
        stage.check_design(Params.model_validate({"replay": {"operators": ["B0", "B7"]}}), ["kbench-sessions"])


def test_sampled_probes_are_seeded_per_session_operator_probe_and_sample(small_corpus, tiny_model_dir):  # noqa: F811
    """Leak@k's replies: the same names give the same samples, other names other ones; a sink
    policy that blocks every call leaves them as they are (a probe reply is free text, not a sink)."""
    from kbench.backends import build_backend
    from kbench.config import ModelConfig
    from kbench.replay.operators import Branch
    from kbench.replay.run import sampled_probes
    from kbench.replay.runtime import SessionRuntime

    backend = build_backend(ModelConfig(path=str(tiny_model_dir)))
    (plan,) = plan_suite(small_corpus, sessions=1, kind="tool", T=2, tau=1, indep=0.0, n_post=4, seed=0)
    runtime = SessionRuntime(backend, plan, AgentConfig(max_new_tokens=8), compression_period=0)

    def branches():
        state = runtime.fresh_state(SessionEnvironment(small_corpus))
        return [("B0", Branch(state)), ("B8", Branch(state.fork(), policy=lambda s, tool, args: True))]

    config = AgentConfig(max_new_tokens=8)
    first = sampled_probes(backend, plan, config, branches(), k=3, temperature=0.7)
    again = sampled_probes(backend, plan, config, branches(), k=3, temperature=0.7)
    assert first == again and set(first["B0"]) == set(plan.probes) and len(first["B0"]["direct"]) == 3
    assert len(set(first["B0"]["direct"])) > 1  # three draws, not one greedy reply three times
    assert not any(reply == BLOCKED for replies in first["B8"].values() for reply in replies)
    assert all(len(replies) == 3 for replies in first["B8"].values())


def test_channel_rates_say_where_z_resurfaces():
    from kbench.records import Action, Step, TraceRecord
    from kbench.replay.channels import channel_rates

    def turn(operator: str, thought: str, args: str, answer: str) -> TraceRecord:
        return TraceRecord(query_id=f"s/{operator}/{thought}", entity_id="e", split="forget", field="employer",
                           ground_truth="Acme Widgets", seed=0, substrate="kbench-sessions", method=operator,
                           steps=[Step(thought=thought, action=Action(tool="send_message", args=args),
                                       observation="Message sent."), Step(thought=None)],
                           retrieval=[], answer=answer, raw_reply="", halted_reason="final_answer", summary="",
                           summary_error=None)

    rates = channel_rates([turn("B0", "it is Acme Widgets", "ops, hello", "done"),
                           turn("B0", "nothing", "ops, Acme Widgets", "Acme Widgets"),
                           turn("B7", "nothing", "ops, hello", "I do not know")])
    assert rates["B0"]["turns"] == 2 and rates["B0"]["Z_CoT"] == 0.5 and rates["B0"]["Z_tool"] == 0.5
    assert rates["B0"]["Z_answer"] == 0.5 and rates["B7"]["Z_answer"] == 0.0
    assert list(rates) == ["B0", "B7"]


def _suite_scores(b7: float, b5: float) -> dict:
    """A suite's scores with B7 and B5 costing `b7` and `b5` recomputed tokens."""
    ops = {op: {"any": 0.0, "cad": 0.0, "recomputed_tokens": tokens, "leak_at_probes": 0.0, "leak_at_k": None}
           for op, tokens in (("B0", 0.0), ("B5", b5), ("B7", b7))}
    return {"operators": ops, "sessions": 4, "valid": True, "savings": b5 / b7, "bound": 1.0, "kept_probes": [],
            "b7_equals_b5": {"equal": 4, "sessions": 4}, "b7_transitions_at_bound": {"at_bound": 4, "sessions": 4},
            "b1_equals_b0": {"equal": 4, "sessions": 4}, "tests": None}


def _suite_file(b7: float, b5: float) -> dict:
    """A suite's versioned scores.json (the golden one) with B7 and B5 costing `b7` and `b5` tokens."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "golden/replay_scores.json").read_text())
    data["operators"]["B7"]["recomputed_tokens"], data["operators"]["B5"]["recomputed_tokens"] = b7, b5
    return {**data, "savings": b5 / b7, "schema_version": 1}


def test_sweep_variants_sample_no_leak_at_k_and_the_suite_keeps_its_own():
    from kbench.config import ReplayConfig

    config = ReplayConfig(suites=["s"], sweep_suites=["s"], tau_sweep=[1, 3], indep_sweep=[0.0], leak_at_k=5)
    found = dict(config.variants("s"))
    assert list(found) == ["s", "s@tau=1", "s@tau=3", "s@indep=0.0"]
    assert found["s"].leak_at_k == 5 and {v.leak_at_k for label, v in found.items() if label != "s"} == {0}
    assert (found["s@tau=3"].tau, found["s@indep=0.0"].indep) == (3, 0.0)


def test_the_tau_sweep_fits_b7_falling_and_b5_flat():
    from kbench.replay.report import render_results, sweep_summary

    suite_scores = _suite_scores
    scores = {"s": suite_scores(400, 600), **{f"s@tau={t}": suite_scores(600 - 100 * (t - 1), 600) for t in (1, 2, 3, 4)},
              "s@indep=0.25": suite_scores(400, 600)}
    summary = sweep_summary("s", scores)
    assert summary["tau"]["b7_fit"]["slope"] == pytest.approx(-100) and summary["tau"]["b7_fit"]["r2"] == pytest.approx(1)
    assert summary["tau"]["b5_fit"]["slope"] == pytest.approx(0)
    assert summary["indep"] == [{"indep": 0.25, "any": {"B0": 0.0, "B5": 0.0, "B7": 0.0}}]
    assert sweep_summary("other", scores) is None
    page = render_results(scores, model="m", params_digest="d", sweeps={"s": summary})
    assert "### τ sweep: s" in page and "| 4 | 300 | 600 |" in page
    table1 = page.split("### Table 1")[1].split("###")[0]
    assert "s: tokens" in table1 and "@" not in table1  # the configured suite's columns only
    variants = page.split("### Sweep variants")[1].split("###")[0]
    assert "| s@tau=4 | B7 | 0.000 | 0.000 | 300 |" in variants and "| s |" not in variants
    assert len([line for line in variants.splitlines() if line.startswith("| s@")]) == 5 * 3  # variants x operators


def test_the_suites_own_run_is_a_point_of_its_sweeps_at_its_tau_and_indep():
    from kbench.replay.report import sweep_summary

    scores = {"s": _suite_scores(500, 600), "s@tau=1": _suite_scores(600, 600), "s@tau=3": _suite_scores(400, 600),
              "s@indep=0.0": _suite_scores(500, 600)}
    summary = sweep_summary("s", scores, tau=2, indep=0.5)
    assert [p["tau"] for p in summary["tau"]["points"]] == [1, 2, 3] and summary["tau"]["points"][1]["b7_tokens"] == 500
    assert summary["tau"]["b7_fit"]["r2"] == pytest.approx(1)
    assert [row["indep"] for row in summary["indep"]] == [0.0, 0.5]
    assert sweep_summary("s", {"s": scores["s"]}, tau=2, indep=0.5) is None  # no sweep ran: no point alone


def test_the_granularity_sweep_sets_b7_at_each_granularity_beside_what_its_checkpoints_cost():
    from kbench.replay.report import render_results, sweep_summary
    from kbench.replay.scoring import checkpoint_costs

    def scores(granularity, b7, checkpoints, metadata):
        found = _suite_scores(b7, 600)
        sessions = [{"checkpoints": checkpoints, "checkpoint_bytes": 0, "checkpoint_metadata_bytes": metadata}] * 2
        return {**found, "checkpoints": checkpoint_costs(granularity, sessions).model_dump(mode="json")}

    found = {"s": scores(EVERY_TURN, 300, 9, 900), "s@checkpoints=session_start": scores(SESSION_START, 600, 3, 120)}
    summary = sweep_summary("s", found)
    assert [(r["granularity"], r["b7_tokens"], r["checkpoints"], r["metadata_bytes"]) for r in summary["checkpoints"]] == [
        (EVERY_TURN, 300, 9, 900), (SESSION_START, 600, 3, 120)]
    page = render_results(found, model="m", params_digest="d", sweeps={"s": summary})
    assert "### Checkpoint granularity: s" in page
    assert "| session_start | 0.000 | 0.000 | - | 600 | 600 | 4/4 | 3.0 | 0 | 120 |" in page


def test_checkpoint_metadata_is_measured_relative_to_the_session():
    """A sweep variant's session id is longer; its checkpoints' metadata bytes are not."""
    from kbench.replay.provenance import Checkpoint
    from kbench.replay.runtime import Snapshot, metadata_bytes

    def snapshots(session: str) -> list[Snapshot]:
        point = Checkpoint(2, "turn", 120, None, "env-1", (f"{session}/turn1/user", f"{session}/turn1/step0"))
        return [Snapshot(point, (), None, (), 1)]

    plain = metadata_bytes(snapshots("s-000"), "s-000")
    assert plain == metadata_bytes(snapshots("s-000@checkpoints=session_start"), "s-000@checkpoints=session_start")
    assert plain < metadata_bytes(snapshots("s-000@checkpoints=session_start"), "s-000")


def test_granularity_keys_at_their_defaults_leave_the_design_digest_unchanged():
    from kbench.config import Params

    default = Params.model_validate({})
    assert "checkpoints" not in default.replay.model_dump() and "checkpoints_sweep" not in default.replay.model_dump()
    swept = Params.model_validate({"replay": {"sweep_suites": ["s"], "checkpoints_sweep": [SESSION_START]}})
    assert [label for label, _ in swept.replay.variants("s")] == ["s", "s@checkpoints=session_start"]
    assert swept.replay.variants("s")[1][1].checkpoints == SESSION_START
    assert swept.replay.variants("s")[1][1].model_dump()["checkpoints"] == SESSION_START
    with pytest.raises(ValueError, match="checkpoints"):
        Params.model_validate({"replay": {"checkpoints": "every_other_turn"}})


def test_the_report_reads_the_suites_and_sweeps_the_params_name(tmp_path, monkeypatch):
    """`lane_scores` reads `replay.out_dir/<label>/scores.json` of every configured label (a
    leftover suite folder is not shown); index.html has the lane's tables and its τ plot."""
    import json

    from kbench.comparison.analysis import compare
    from kbench.comparison.report import Provenance
    from kbench.config import Params
    from kbench.stages.compare import lane_scores, write_reports

    monkeypatch.chdir(tmp_path)
    params = Params.model_validate({"replay": {"suites": ["s"], "sweep_suites": ["s"], "tau_sweep": [1, 2, 3]}})
    for t, label in enumerate(["s", "s@tau=1", "s@tau=2", "s@tau=3", "leftover"]):
        (tmp_path / "artifacts/replay" / label).mkdir(parents=True)
        (tmp_path / "artifacts/replay" / label / "scores.json").write_text(json.dumps(_suite_file(600 - 100 * t, 600)))
    lanes = lane_scores(params)
    assert list(lanes.replay) == ["s", "s@tau=1", "s@tau=2", "s@tau=3"] and lanes.memory == {}
    assert lanes.sweeps["s"]["tau"]["b7_fit"]["slope"] == pytest.approx(-100)
    write_reports(compare([], params.scoring), tmp_path / "reports", Provenance("kbench", "sqlite://", 0, "abc"),
                  None, lanes)
    section = (tmp_path / "reports/index.html").read_text().split('<h2 id="replay">')[1].split('<h2 id="memory">')[0]
    assert "Table 1: leaks and cost" in section and "<td>B7</td>" in section and "Exactness and savings" in section
    assert "τ sweep: s" in section and 'alt="recomputed tokens against tau" src="data:image/png;base64,' in section
    (tmp_path / "artifacts/replay/s/scores.json").write_text("{")
    with pytest.raises(ValueError, match=r"artifacts/replay/s/scores.json is unreadable .*rerun `dvc repro replay`"):
        lane_scores(params)


def test_a_model_the_kv_engine_cannot_hold_is_refused_in_one_line(tmp_path, tiny_model_dir):  # noqa: F811
    import json
    import shutil

    import kbench.stages.replay as stage
    from kbench.config import Params

    chunked = tmp_path / "chunked"
    shutil.copytree(tiny_model_dir, chunked)
    config = json.loads((chunked / "config.json").read_text())
    config.update(model_type="llama4_text", architectures=["Llama4ForCausalLM"], attention_chunk_size=8,
                  num_local_experts=1)
    (chunked / "config.json").write_text(json.dumps(config))
    params = Params.model_validate({"agent_base": {"out_dir": str(chunked)}})
    with pytest.raises(stage.ReplayStageError, match=r"runs on the KV engine, which cannot hold .*chunked_attention.*"
                                                      r"set replay.suites: \[\]"):
        stage.main(params, stage.Options())
