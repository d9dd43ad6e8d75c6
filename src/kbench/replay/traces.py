"""The lane's sessions as MLflow traces (the UI's Traces tab): one trace per session, a span
per operator branch, under it a span per post-revocation turn (its answer, tool calls and
memory writes) and one for the probes' replies."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from kbench.replay.records import SessionRecord


def log_sessions(records: Iterable[SessionRecord], run_id: str) -> int:
    """Log one trace per session (its records under every operator), linked to `run_id`."""
    import mlflow
    from mlflow.entities import SpanType

    count = 0
    for session_id, group in groupby(records, key=lambda r: r.session_id):
        branches = list(group)
        first = branches[0]
        with mlflow.start_span(name=f"session {session_id}", span_type=SpanType.AGENT, run_id=run_id) as root:
            root.set_inputs({"suite": first.suite, "target": first.target, "target_field": first.target_field,
                             "tau": first.tau, "T": first.T})
            for record in branches:
                with mlflow.start_span(name=record.operator, span_type=SpanType.CHAIN) as branch:
                    branch.set_attributes({"transitions": record.transitions,
                                           "recomputed_tokens": record.recomputed_tokens,
                                           "final_state_sha256": record.final_state_sha256})
                    for turn in record.post:
                        with mlflow.start_span(name=f"turn {turn.turn}", span_type=SpanType.LLM) as span:
                            span.set_inputs({"depends_on_target": turn.depends_on_target})
                            span.set_outputs(turn.model_dump(include={"answer", "tool_calls", "memory_writes"}))
                    with mlflow.start_span(name="probes", span_type=SpanType.LLM) as probes:
                        probes.set_outputs(record.probes)
            root.set_outputs({"operators": [r.operator for r in branches]})
        count += 1
    return count
