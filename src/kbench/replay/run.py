"""One session end to end (SPEC §14): the contaminated run, every operator's branch, the same
post-revocation turns and probes on each, and one record per operator.

The turns before the revocation run one at a time (a batch of one), so the full reset and the
selective replay do exactly the arithmetic the first run did; the post-revocation turns and the
probes run every operator's branch in one batch a step at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kbench.agent.prompts import OBSERVATION_PREFIX
from kbench.backends import Backend, Message
from kbench.backends.hf import encode_prompt
from kbench.config import AgentConfig
from kbench.corpus import Corpus
from kbench.observer.matcher import match
from kbench.replay.environment import SessionEnvironment
from kbench.replay.operators import Branch, OperatorContext, OperatorError, build_operator
from kbench.replay.provenance import ProvenanceError, compare_closures
from kbench.replay.records import PROBES, SessionRecord
from kbench.replay.runtime import BLOCKED, ReplayRuntimeError, SessionRuntime, TurnRun, final_state_sha256, retained_bytes
from kbench.replay.sessions import SessionPlan

log = logging.getLogger(__name__)


class TargetNeverEntered(ReplayRuntimeError):
    """z's source never reached the session's state (the agent never looked it up)."""


@dataclass(frozen=True)
class SessionResult:
    """One session's records and what the lane reports beside them."""

    records: list[SessionRecord]
    #: The τ the provenance graph found (the plan's when the agent looked z up when asked).
    tau: int
    #: Checkpoints taken, and the cache bytes they keep alive beyond the live states.
    checkpoints: int
    checkpoint_bytes: int
    #: The oracle taint closure beside the data-flow one (artifact ids).
    closures: dict[str, list[str]]


def run_session(backend: Backend, corpus: Corpus, plan: SessionPlan, config: AgentConfig, *,
                operators: Sequence[str], compression_period: int) -> SessionResult:
    """Run `plan` and every operator; TargetNeverEntered when z never reached the state."""
    if backend.session() is None:
        raise OperatorError("the execution-state lane runs on the KV engine: model.backend hf with model.engine kv")
    engine = backend.engine  # type: ignore[attr-defined]
    runtime = SessionRuntime(backend, plan, config, compression_period=compression_period)
    env = SessionEnvironment(corpus, source=(plan.target_entity, plan.target_field))
    contaminated = runtime.fresh_state(env)
    runtime.run_session_turns(contaminated, 1, sanitized=False, shadow=False, call_prefix=plan.session_id, record=True)
    try:
        tau = contaminated.graph.tau(plan.source_id)
    except ProvenanceError:
        raise TargetNeverEntered(f"session {plan.session_id}: z never entered the state (the agent did not read "
                                 f"{plan.target_field} of {corpus.entities[plan.target_entity].name}); not scored") from None

    def holds(text: str) -> bool:
        return match(plan.target_field, plan.target, text).leaked

    closure = frozenset(contaminated.graph.taint_closure(plan.source_id))
    branches: dict[str, Branch] = {}

    def branch_of(name: str) -> Branch:
        if name not in branches:
            operator = build_operator(name)
            tokens0, started = engine.stats.prefill_tokens + engine.stats.generated_tokens, time.perf_counter()
            made = operator.apply(context)
            made.recomputed_tokens += engine.stats.prefill_tokens + engine.stats.generated_tokens - tokens0
            made.seconds += time.perf_counter() - started
            made.state.env.withheld = runtime.withheld  # after the revocation the world holds no z
            branches[name] = made
            log.info("%s %s: %d transitions, %d tokens recomputed, %.1f s", plan.session_id, name,
                     made.transitions, made.recomputed_tokens, made.seconds)
        return branches[name]

    context = OperatorContext(runtime, contaminated, source=plan.source_id, tau=tau, closure=closure,
                              branch_of=branch_of)
    for name in operators:
        branch_of(name)
    chosen = [(name, branches[name]) for name in operators]

    outcomes: dict[str, list] = {name: [] for name, _ in chosen}
    for turn in plan.post:
        runs = [TurnRun(runtime, b.state, turn, user=turn.user, call_prefix=f"{plan.session_id}/{name}",
                        shadow=False, policy=b.policy, source=None) for name, b in chosen]
        runtime.run_turns(runs)
        for (name, _), run in zip(chosen, runs):
            outcomes[name].append(run.outcome)

    probes: dict[str, dict[str, str]] = {name: {} for name, _ in chosen}
    for probe in PROBES:
        message = Message(role="user", content=plan.probes[probe])
        conversations = [b.state.conversation(config.max_iters, [message]) for _, b in chosen]
        states = [None if b.state.kv is None else b.state.fork().kv for _, b in chosen]
        generations = backend.generate(conversations, stop=[OBSERVATION_PREFIX], max_new_tokens=config.max_new_tokens,
                                       sessions=states, share_prefixes=False)
        for (name, b), generation in zip(chosen, generations):
            blocked = b.policy is not None and b.policy(b.state)
            probes[name][probe] = BLOCKED if blocked else generation.text.strip()

    records = []
    for name, b in chosen:
        tokens = encode_prompt(backend.tokenizer, b.state.conversation(config.max_iters))
        outputs = [reply for o in outcomes[name] for reply in o.replies] + [probes[name][p] for p in PROBES]
        records.append(SessionRecord(
            session_id=plan.session_id, suite=plan.suite, operator=name, target=plan.target,
            target_field=plan.target_field, tau=tau, T=plan.T, transitions=b.transitions,
            recomputed_tokens=b.recomputed_tokens, seconds=round(b.seconds, 3),
            post=[o.post() for o in outcomes[name]], probes=probes[name],
            final_state_sha256=final_state_sha256(tokens, outputs),
        ))
    return SessionResult(
        records=records, tau=tau, checkpoints=len(runtime.snapshots),
        checkpoint_bytes=retained_bytes(runtime.snapshots, [b.state.kv for _, b in chosen] + [contaminated.kv]),
        closures=compare_closures(contaminated.graph, plan.source_id, holds).to_json(),
    )
