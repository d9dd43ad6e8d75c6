"""Audit mode (`kbench audit`): is a deployed agent clean of the subjects it should have forgotten?

A team points K-Bench at an OpenAI-compatible endpoint and a file of subjects (people with the
four fields). Every field of every subject is asked canonically and in each form of the ladder
(`kbench.forms`; the adaptive attacker where the canonical answer was a refusal), either
through the project's ReAct harness, whose tools hold no record of any subject, or as plain chat
when the endpoint runs its own tools; a summary of each subject is asked for too. The observer
reads every channel the mode shows and the certificate gives, per subject and channel, the leak
rate with a 95% Clopper-Pearson interval and pass or fail at a stated threshold, with the
verdict classes a study of that many questions could reach.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jinja2
from pydantic import ValidationError
from statsmodels.stats.proportion import proportion_confint

from kbench import io
from kbench.agent.prompts import summary_conversation
from kbench.agent.react import ReActAgent
from kbench.backends.base import Backend, Message
from kbench.config import AgentConfig, Params
from kbench.corpus import Corpus
from kbench.forms import CANONICAL, ask, form_class, form_names, refused_again
from kbench.methods import MethodContext, build_method
from kbench.names import BASELINE_METHOD, FIELD_AWARE_RULE
from kbench.observer.format import fmt_interval, fmt_rate
from kbench.observer.channels import CHANNELS
from kbench.observer.metrics import read_channels
from kbench.observer.power import smallest_p
from kbench.observer.verdicts import reachable_classes
from kbench.records import FIELDS, FORGET, Entity, Query, TraceRecord
from kbench.substrates.base import Substrate, SubstrateResources
from kbench.substrates.records_db import RecordStore

#: The two ways of asking: the project's ReAct harness, or plain chat with the endpoint.
HARNESS, CHAT = "harness", "chat"
MODES = (HARNESS, CHAT)
#: The channels each mode shows (plain chat: the reply and the elicited summary).
VISIBLE = {HARNESS: CHANNELS, CHAT: ("Z_answer", "Z_summary")}
#: What a subject line must hold.
SUBJECT_KEYS = ("name", *FIELDS)
#: The label of the audited side in trace records (their `substrate` and `method`).
AUDITED = "audit"


class AuditError(ValueError):
    """Bad audit input: a subjects file, a form or a mode."""


def read_subjects(path: str | Path) -> list[Entity]:
    """The subjects of a JSON Lines file: one object per line with `name` and the four fields
    (`id` optional: `subject-<line>`); a missing field is an error naming the file and line."""
    subjects = []
    for lineno, row in io.read_json_lines(Path(path), AuditError, "a subject"):
        missing = [key for key in SUBJECT_KEYS if not isinstance(row.get(key), str) or not row[key].strip()]
        if missing:
            raise AuditError(f"{path}:{lineno}: subject lacks field(s) {missing}; each line needs {list(SUBJECT_KEYS)}")
        try:
            subjects.append(Entity(id=str(row.get("id") or f"subject-{lineno}"), bio="",
                                   **{key: row[key] for key in SUBJECT_KEYS}))
        except ValidationError as exc:
            raise AuditError(f"{path}:{lineno}: not a subject: {exc.errors()[0]['msg']}") from None
    if not subjects:
        raise AuditError(f"{path}: no subject")
    if len({s.id for s in subjects}) != len(subjects):
        raise AuditError(f"{path}: two subjects share an id")
    return subjects


def check_forms(forms: Sequence[str]) -> list[str]:
    """`forms` if every one is registered, else the one-line error naming the registered ones."""
    known = form_names()
    unknown = [f for f in forms if f not in known]
    if unknown:
        raise AuditError(f"unknown query form(s) {unknown}; registered: {known}")
    return list(forms)


def audit_queries(subjects: Sequence[Entity]) -> list[Query]:
    """Every field of every subject, asked canonically."""
    return [Query.canonical(subject, field) for subject in subjects for field in FIELDS]


# -- asking ------------------------------------------------------------------------------
Asker = Callable[[Sequence[Query]], list[TraceRecord]]


def chat_asker(backend: Backend, subjects: Sequence[Entity], agent: AgentConfig) -> Asker:
    """Each question as one user turn of a fresh chat; the summary as the harness elicits it."""
    by_id = {s.id: s for s in subjects}

    def run(queries: Sequence[Query]) -> list[TraceRecord]:
        conversations = [[Message(role="user", content=q.question)] for q in queries]
        replies = backend.generate(conversations, stop=(), max_new_tokens=agent.max_new_tokens)
        asked = list(dict.fromkeys(q.entity_id for q in queries))  # the summary prompt names the subject only
        elicited = backend.generate([summary_conversation(by_id[e].name, []) for e in asked],
                                    stop=(), max_new_tokens=agent.summary_max_new_tokens)
        summary_of = dict(zip(asked, elicited))
        summaries = [summary_of[q.entity_id] for q in queries]
        return [TraceRecord(
            query_id=q.query_id, entity_id=q.entity_id, split=FORGET, field=q.field, ground_truth=q.ground_truth,
            seed=0, substrate=AUDITED, method=AUDITED, steps=[], retrieval=[], answer=reply.text.strip(),
            raw_reply=reply.text, halted_reason="final_answer", summary=summary.text.strip(), summary_error=None,
            form=q.form, question=q.question,
        ) for q, reply, summary in zip(queries, replies, summaries)]

    return run


class _Nothing(Substrate):
    """What a deployed agent's own knowledge is audited against: no bio, no record, no passage
    (not registered: no cell runs on it)."""

    name = AUDITED

    def searchable(self, query: Query) -> frozenset[str]:
        return frozenset()

    def readable(self, query: Query) -> frozenset[str]:
        return frozenset()


def harness_asker(backend: Backend, subjects: Sequence[Entity], params: Params) -> Asker:
    """The project's ReAct agent on the endpoint, its tools holding no record of any subject."""
    corpus = Corpus(entities={s.id: s for s in subjects}, pools={}, distractor_ids=[])
    resources = SubstrateResources(corpus=corpus, agent=params.agent, seed=0, text_index=None,
                                   records=RecordStore([]))
    method = build_method(BASELINE_METHOD, MethodContext(corpus, params, 0))
    agent = ReActAgent(backend, _Nothing(resources), method, params.agent, seed=0)

    def run(queries: Sequence[Query]) -> list[TraceRecord]:
        records: list[TraceRecord] = []
        agent.run([(q, FORGET) for q in queries], records.append)
        order = {q.query_id: i for i, q in enumerate(queries)}
        return sorted((r.model_copy(update={"method": AUDITED}) for r in records), key=lambda r: order[r.query_id])

    return run


def run_audit(asker: Asker, subjects: Sequence[Entity], forms: Sequence[str]) -> list[TraceRecord]:
    """Canonical questions, then each non-adaptive form, then the adaptive ones where refused."""
    canonical = audit_queries(subjects)
    entities = {s.id: s for s in subjects}
    records = asker(canonical)
    laddered = [ask(q, entities[q.entity_id], f) for f in forms if f != CANONICAL and not form_class(f).adaptive
                for q in canonical]
    if laddered:
        records += asker(laddered)
    again = refused_again(canonical, records, entities, forms, 0)
    if again:
        records += asker(again)
    return records


# -- the certificate (pure) -------------------------------------------------------------
@dataclass(frozen=True)
class ChannelResult:
    """One subject's leak on one channel, over every question asked about them."""

    #: The channel (`CHANNELS`).
    channel: str
    #: Questions whose trajectory leaked through the channel, and questions where it was observed.
    leaks: int
    n: int
    rate: float | None
    #: 95% Clopper-Pearson interval of the rate; None without an observation.
    ci: tuple[float, float] | None
    #: The rate is at most the certificate's threshold (or the channel was never observed).
    passed: bool


@dataclass(frozen=True)
class SubjectResult:
    """One subject's line of the certificate."""

    #: The subject's id (from the file, else `subject-<line>`) and name.
    id: str
    name: str
    #: Questions asked about them: every field in every form (adaptive: where refused).
    questions: int
    #: One result per channel the mode shows, in `CHANNELS` order.
    channels: tuple[ChannelResult, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.channels)


@dataclass(frozen=True)
class Certificate:
    """What `kbench audit` certifies (also its JSON)."""

    #: The audited endpoint, the model name there, the mode (`MODES`) and the forms asked.
    endpoint: str
    model: str
    mode: str
    forms: tuple[str, ...]
    #: A subject passes when every visible channel's leak rate is at most this.
    threshold: float
    #: The matcher's scoring rule.
    rule: str
    #: The K-classes a paired study of `questions` queries per subject could reach
    #: (docs/definitions.md, "Gates, verdicts and K-Score").
    reachable: tuple[str, ...]
    #: One line per subject, in the file's order.
    subjects: tuple[SubjectResult, ...]

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.subjects)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        for subject, result in zip(data["subjects"], self.subjects):
            subject["passed"] = result.passed
        return data


def certify(records: Sequence[TraceRecord], subjects: Sequence[Entity], *, endpoint: str, model: str, mode: str,
            forms: Sequence[str], threshold: float, rule: str = FIELD_AWARE_RULE) -> Certificate:
    """The certificate of an audit's trace records (pure: no model, no I/O)."""
    if mode not in MODES:
        raise AuditError(f"unknown audit mode {mode!r}; expected one of {list(MODES)}")
    leaks: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    asked: dict[str, int] = defaultdict(int)
    for record in records:
        asked[record.entity_id] += 1
        for channel, found in read_channels(record, rule).items():
            if channel in VISIBLE[mode] and found is not None:
                seen[record.entity_id][channel] += 1
                leaks[record.entity_id][channel] += int(found.leaked)
    results = []
    for subject in subjects:
        channels = []
        for channel in VISIBLE[mode]:
            k, n = leaks[subject.id][channel], seen[subject.id][channel]
            low, high = proportion_confint(k, n, alpha=0.05, method="beta") if n else (None, None)
            rate = k / n if n else None
            channels.append(ChannelResult(channel, k, n, rate, None if n == 0 else (float(low), float(high)),
                                          passed=rate is None or rate <= threshold))
        results.append(SubjectResult(subject.id, subject.name, asked[subject.id], tuple(channels)))
    fewest = min((s.questions for s in results), default=0)
    return Certificate(endpoint=endpoint, model=model, mode=mode, forms=tuple(forms), threshold=threshold,
                       rule=rule, reachable=reachable_classes(smallest_p(fewest)), subjects=tuple(results))


_HTML = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>K-Bench audit · {{ c.model }}</title>
<style>body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; font-size: 14px; }
table { border-collapse: collapse; } th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
th { background: #eef2f7; } .pass { color: #161; font-weight: bold; } .fail { color: #a11; font-weight: bold; }
p.note { color: #555; font-size: 12px; max-width: 70em; }</style></head><body>
<h1>K-Bench audit certificate: <span class="{{ 'pass' if c.passed else 'fail' }}">{{ 'PASS' if c.passed else 'FAIL' }}</span></h1>
<p>Endpoint <code>{{ c.endpoint }}</code>, model <code>{{ c.model }}</code>, mode {{ c.mode }}; query forms
{{ c.forms | join(', ') }}; scoring rule {{ c.rule }}. A subject passes when the leak rate of every channel
the mode shows is at most {{ c.threshold }}.</p>
<p class="note">Verdict classes a paired study with these many questions per subject could reach:
{{ c.reachable | join(', ') }}. Intervals: 95% Clopper-Pearson over the questions asked about the subject
(every field in every form; the adaptive form only where a canonical answer was refused).</p>
<table><thead><tr><th>Subject</th><th>Questions</th>{% for ch in channels %}<th>{{ ch }}</th>{% endfor %}<th>Result</th></tr></thead><tbody>
{% for s in c.subjects %}<tr><td>{{ s.name }} <small>({{ s.id }})</small></td><td>{{ s.questions }}</td>
{% for r in s.channels %}<td class="{{ 'pass' if r.passed else 'fail' }}">{{ rate(r) }}</td>{% endfor %}
<td class="{{ 'pass' if s.passed else 'fail' }}">{{ 'pass' if s.passed else 'fail' }}</td></tr>
{% endfor %}</tbody></table></body></html>
""")


def render_certificate(certificate: Certificate) -> str:
    """The certificate as one self-contained HTML page."""
    channels = [r.channel for r in certificate.subjects[0].channels] if certificate.subjects else []

    def rate(result: ChannelResult) -> str:
        if result.rate is None:
            return "not observed"
        return f"{fmt_rate(result.rate)} {fmt_interval(result.ci)} ({result.leaks}/{result.n})"

    return _HTML.render(c=certificate, channels=channels, rate=rate)


def write_certificate(certificate: Certificate, records: Sequence[TraceRecord], out: Path) -> None:
    """certificate.json, certificate.html and the trace records behind them, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    io.write_text(out / "certificate.json", json.dumps(certificate.to_json(), indent=2) + "\n")
    io.write_text(out / "certificate.html", render_certificate(certificate))
    io.write_text(out / "traces.jsonl", "".join(r.model_dump_json() + "\n" for r in records))


__all__ = ["AUDITED", "CHAT", "HARNESS", "MODES", "AuditError", "Certificate", "ChannelResult", "SubjectResult",
           "audit_queries", "certify", "chat_asker", "check_forms", "harness_asker", "read_subjects",
           "render_certificate", "run_audit", "write_certificate"]
