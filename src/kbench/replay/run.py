"""One session end to end (docs/replay.md, "Sessions and operators"): the contaminated run, every operator's
branch, the same
post-revocation turns and probes on each, and one record per operator.

The turns before the revocation run one at a time (a batch of one), so the full reset and the
selective replay do exactly the arithmetic the first run did; the post-revocation turns and the
probes run every operator's branch in one batch a step at a time (Leak@k's samples one branch at a time).
An operator's cost is measured here, around its `apply`: the agent turns the runtime ran and the
tokens it fed through the model, never a number the operator states.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kbench.agent.prompts import OBSERVATION_PREFIX
import torch

from kbench.backends import Backend, KVSessions, Message
from kbench.backends.base import truncate_at_stop
from kbench.config import AgentConfig
from kbench.names import EVERY_TURN, CheckpointGranularity
from kbench.observer.matcher import match
from kbench.replay.operators import Branch, OperatorContext, OperatorError, build_operator
from kbench.replay.provenance import ProvenanceError, compare_closures
from kbench.replay.records import PROBES, SessionRecord
from kbench.records import FORGET, TraceRecord
from kbench.replay.runtime import (
    ReplayRuntimeError,
    SessionRuntime,
    SessionState,
    TurnOutcome,
    TurnRun,
    final_state_sha256,
    metadata_bytes,
)
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
    #: Checkpoints taken, the cache bytes they keep alive beyond the live states, and the bytes of
    #: what they record besides the cache handles.
    checkpoints: int
    checkpoint_bytes: int
    checkpoint_metadata_bytes: int
    #: The oracle taint closure beside the data-flow one (artifact ids).
    closures: dict[str, list[str]]
    #: Each post-revocation turn of each operator as a K-Bench trace record (docs/definitions.md, "The trace record").
    traces: list[TraceRecord]


def kv_sessions(backend: Backend) -> KVSessions:
    """The backend's KV operations on sessions; OperatorError when it has none."""
    kv = backend.kv_sessions()
    if kv is None:
        raise OperatorError("the execution-state lane runs on the KV engine: model.backend hf with model.engine kv")
    return kv


def sample_seed(*parts: str) -> int:
    """A generator seed from names (the same on every machine and run)."""
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:8], "big")


def sampled_probes(backend: Backend, plan: SessionPlan, config: AgentConfig, chosen: Sequence[tuple[str, Branch]],
                   *, k: int, temperature: float) -> dict[str, dict[str, list[str]]]:
    """k replies per probe and branch sampled at `temperature` (Leak@k), each from its own seeded generator.
    A branch's k rows decode as one batch: the engine pads every row of a batch to the longest
    cache, so all branches at once would hold operators x k copies of a whole session's cache."""
    kv = kv_sessions(backend)
    samples: dict[str, dict[str, list[str]]] = {name: {} for name, _ in chosen}
    started = time.perf_counter()
    for probe, (name, branch) in itertools.product(PROBES, chosen):
        message = Message(role="user", content=plan.probes[probe])
        prompt = kv.encode(branch.state.conversation(config.max_iters, [message]))
        states = [branch.state.fork().kv for _ in range(k)]
        generators = [torch.Generator().manual_seed(sample_seed(plan.session_id, name, probe, str(j))) for j in range(k)]

        def choose(row: int, logits: torch.Tensor) -> int:
            weights = torch.softmax(logits.float() / temperature, dim=-1)
            return int(torch.multinomial(weights, 1, generator=generators[row]))

        outputs = kv.generate(states, [prompt] * k, max_new_tokens=config.max_new_tokens,
                              stop=[OBSERVATION_PREFIX], choose=choose)
        # a probe reply is free text: no sink policy (B8, B9) applies to it
        samples[name][probe] = [truncate_at_stop(kv.decode(tokens), [OBSERVATION_PREFIX]).strip() for tokens in outputs]
        if name == chosen[-1][0]:  # a probe sampled on every branch: a progress line
            log.info("%s Leak@%d: probe %s sampled on %d operators, %.1f s", plan.session_id, k, probe, len(chosen),
                     time.perf_counter() - started)
            started = time.perf_counter()
    return samples


def run_session(backend: Backend, env: Any, plan: SessionPlan, config: AgentConfig, *,
                operators: Sequence[str], compression_period: int, leak_at_k: int = 0,
                temperature: float = 0.7, seed: int = 0, checkpoints: CheckpointGranularity = EVERY_TURN
                ) -> SessionResult:
    """Run `plan` on its contaminated world `env` and every operator; TargetNeverEntered when z
    never reached the state."""
    kv = kv_sessions(backend)
    runtime = SessionRuntime(backend, plan, config, compression_period=compression_period, checkpoints=checkpoints)
    contaminated = runtime.fresh_state(env)
    runtime.run_session_turns(contaminated, 1, sanitized=False, shadow=False, call_prefix=plan.session_id, record=True)
    try:
        tau = contaminated.graph.tau(plan.source_id)
    except ProvenanceError:
        raise TargetNeverEntered(f"session {plan.session_id}: z never entered the state (the agent never read the "
                                 f"{plan.target_field} of {plan.target_entity} it was given); not scored") from None

    def holds(text: str) -> bool:
        return match(plan.target_field, plan.target, text).leaked

    closure = frozenset(contaminated.graph.taint_closure(plan.source_id))
    branches: dict[str, Branch] = {}
    #: Per `apply` in progress, the (turns, tokens, seconds) of other branches it computed: not its own.
    nested: list[list[float]] = []

    def branch_of(name: str) -> Branch:
        if name not in branches:
            operator = build_operator(name)
            turns0, tokens0, started = runtime.turns_executed, kv.tokens_fed(), time.perf_counter()
            nested.append([0, 0, 0.0])
            made = operator.apply(context)
            inner = nested.pop()
            made.transitions = runtime.turns_executed - turns0 - int(inner[0])
            made.recomputed_tokens = kv.tokens_fed() - tokens0 - int(inner[1])
            made.seconds = time.perf_counter() - started - inner[2]
            if nested:  # computed inside another operator's apply: its cost (and its inner ones') is not the caller's
                own = (made.transitions, made.recomputed_tokens, made.seconds)
                nested[-1][:] = [o + m + i for o, m, i in zip(nested[-1], own, inner)]
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
    log.info("%s: %d turns after the operators run on %d branches", plan.session_id, len(plan.post), len(chosen))

    probes: dict[str, dict[str, str]] = {name: {} for name, _ in chosen}
    for probe in PROBES:
        message = Message(role="user", content=plan.probes[probe])
        conversations = [b.state.conversation(config.max_iters, [message]) for _, b in chosen]
        states = [None if b.state.kv is None else b.state.fork().kv for _, b in chosen]
        generations = backend.generate(conversations, stop=[OBSERVATION_PREFIX], max_new_tokens=config.max_new_tokens,
                                       sessions=states, share_prefixes=False)
        for (name, _), generation in zip(chosen, generations):  # free text: no sink policy applies
            probes[name][probe] = generation.text.strip()

    samples = (sampled_probes(backend, plan, config, chosen, k=leak_at_k, temperature=temperature) if leak_at_k
               else {name: {} for name, _ in chosen})
    traces = [turn_trace(plan, name, outcome, b.state, config, seed=seed)
              for name, b in chosen for outcome in outcomes[name]]
    records = []
    for name, b in chosen:
        tokens = kv.encode(b.state.conversation(config.max_iters))
        outputs = [reply for o in outcomes[name] for reply in o.replies] + [probes[name][p] for p in PROBES]
        records.append(SessionRecord(
            session_id=plan.session_id, suite=plan.suite, operator=name, target=plan.target,
            target_field=plan.target_field, tau=tau, T=plan.T, transitions=b.transitions,
            recomputed_tokens=b.recomputed_tokens, seconds=round(b.seconds, 3),
            post=[o.post() for o in outcomes[name]], probes=probes[name], probe_samples=samples[name],
            blocked_calls=[call for o in outcomes[name] for call in o.blocked],
            final_state_sha256=final_state_sha256(tokens, outputs),
        ))
    return SessionResult(
        records=records, tau=tau, checkpoints=len(runtime.snapshots),
        checkpoint_bytes=kv.retained_bytes([s.checkpoint.cache for s in runtime.snapshots],
                                           [b.state.kv for _, b in chosen] + [contaminated.kv]),
        checkpoint_metadata_bytes=metadata_bytes(runtime.snapshots, plan.session_id),
        closures=compare_closures(contaminated.graph, plan.source_id, holds).to_json(),
        traces=traces,
    )


def turn_trace(plan: SessionPlan, operator: str, outcome: TurnOutcome, state: SessionState, config: AgentConfig,
               *, seed: int) -> TraceRecord:
    """One post-revocation turn as a trace record: the suite is its substrate, the operator its
    method, z its ground truth, the branch's summary its summary channel."""
    return TraceRecord(
        query_id=f"{plan.session_id}/{operator}/turn{outcome.turn}", entity_id=plan.target_entity,
        split=FORGET, field=plan.target_field, ground_truth=plan.target, seed=seed, substrate=plan.suite,
        method=operator, steps=outcome.steps, retrieval=[], answer=outcome.answer,
        raw_reply="\n".join(outcome.replies), halted_reason=outcome.halted_reason,  # type: ignore[arg-type]
        summary=state.summary.text if state.summary else "", summary_error=None, answer_rule=config.answer_rule,
        question=next(t.user for t in plan.post if t.number == outcome.turn),
    )
