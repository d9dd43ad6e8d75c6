"""The lane's instances as MLflow traces (the UI's Traces tab): one trace per instance and
system, a span per version, under it a span per session with one per turn, one per forget
request (forget version), one for what the system kept and one per probe with its reply."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kbench.memory.instances import Instance
from kbench.memory.records import CONTROL_VERSION, FORGET_VERSION, ItemRecord


def log_instances(instances: Sequence[Instance], records: Iterable[ItemRecord], info: Mapping[str, dict],
                  run_id: str) -> int:
    """Log one trace per instance (both versions, every probe reply), linked to `run_id`."""
    import mlflow
    from mlflow.entities import SpanType

    replies: dict[tuple[str, str], list[ItemRecord]] = {}
    for record in records:
        replies.setdefault((record.instance_id, record.version), []).append(record)
    count = 0
    for instance in instances:
        entry = info.get(instance.instance_id, {})
        with mlflow.start_span(name=f"instance {instance.instance_id}", span_type=SpanType.AGENT, run_id=run_id) as root:
            root.set_inputs({"tier": instance.tier, "profile": instance.profile})
            for version in (CONTROL_VERSION, FORGET_VERSION):
                with mlflow.start_span(name=f"{version} version", span_type=SpanType.CHAIN):
                    sessions = instance.forget if version == FORGET_VERSION else instance.control
                    for n, session in enumerate(sessions):
                        with mlflow.start_span(name=f"session {n} ({session.date})", span_type=SpanType.CHAIN):
                            for i, turn in enumerate(session.turns):
                                with mlflow.start_span(name=f"turn {i} ({turn.role})", span_type=SpanType.UNKNOWN) as span:
                                    span.set_inputs({"content": turn.content})
                    if version == FORGET_VERSION:
                        for request in instance.requests:
                            with mlflow.start_span(name=f"request {request.type}", span_type=SpanType.UNKNOWN) as span:
                                span.set_inputs(request.model_dump(include={"request_id", "type", "fields", "text"}))
                    with mlflow.start_span(name="memory", span_type=SpanType.MEMORY) as span:
                        span.set_outputs({"memory": entry.get("memories", {}).get(version, "")})
                    for record in replies.get((instance.instance_id, version), []):
                        name = f"probe {record.suite}" + (f"/{record.attack}" if record.attack else "")
                        with mlflow.start_span(name=name, span_type=SpanType.LLM) as span:
                            span.set_inputs(record.model_dump(include={"probe_id", "request_type", "field", "value"}))
                            span.set_outputs({"reply": record.reply})
            root.set_outputs({"failures": entry.get("failures"), "seconds": entry.get("seconds")})
        count += 1
    return count
