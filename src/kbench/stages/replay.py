"""The `replay` stage (`kbench replay-run`): the execution-state lane (docs/replay.md).

For each suite of `replay.suites`, the sessions are planned from the corpus, run on the agent
base with the KV engine, and every operator of `replay.operators` acts on each; the records go
to `replay.out_dir/<suite>/sessions.jsonl` (one per session × operator), the lane's scores to
`scores.json`, what the provenance found per session to `sessions.json`, and the suite is
logged as an MLflow run (each operator's metrics under its id). Sessions are written as they
finish (atomically); a rerun with the same inputs keeps them and runs the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from kbench import io, tracking
from kbench.backends.hf import engine_reason
from kbench.config import AgentConfig, Params
from kbench.corpus import Corpus, load_corpus
from kbench.names import HF_BACKEND, LANE_SCORES_FILE
from kbench.parametric.agent_base import agent_model_config
from kbench.records import TraceRecord, iter_traces
from kbench.replay.channels import channel_rates
from kbench.replay.operators import OperatorError, operator_names
from kbench.replay.records import FULL_RESET, SESSION_VERSION, SessionRecord, read_sessions, write_sessions
from kbench.replay.run import SessionResult, TargetNeverEntered, run_session
from kbench.replay.report import render_no_suites, render_results, sweep_summary
from kbench.replay.sessions import SessionPlan
from kbench.replay.scoring import SuiteScores, checkpoint_costs, suite_scores
from kbench.replay.suites import check_suite, suite_sessions
from kbench.replay.traces import log_sessions
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.inputs import shaping
from kbench.stages.unit import PartFiles, Parts, open_unit, worker_backend, worker_corpus
from kbench.workers import run_items

log = logging.getLogger(__name__)

COMMAND = "replay-run"
HELP = "run the execution-state lane: sessions, forget operators B0-B9, records and scores (replay.*)"
SESSIONS_FILE, SCORES_FILE, INFO_FILE = "sessions.jsonl", LANE_SCORES_FILE, "sessions.json"
TRACES_FILE = "turns.jsonl"
SWEEP_FILE = "sweeps.json"  # not traces.jsonl: the sessions are logged as traces, not each turn
KIND_REPLAY = "replay"


class ReplayStageError(ValueError):
    """An unknown suite or operator, or a design the lane cannot run."""


def check_design(params: Params, suites: list[str]) -> None:
    """Every suite and operator named exists, and B5 (the reference) is among the operators."""
    for suite in suites:
        check_suite(suite)
    known = operator_names()
    for name in params.replay.operators:
        if name not in known:
            raise OperatorError(f"unknown operator {name!r}; registered: {known}")
    if FULL_RESET not in params.replay.operators:
        raise ReplayStageError(f"replay.operators must include {FULL_RESET}, the full reset every operator is scored against")


def _inputs(params: Params, corpus_dir: Path) -> dict:
    """What a finished session depends on: the shaping params, the agent base, the corpus and what
    a session computes (`SESSION_VERSION`)."""
    return {"params": shaping(params, "replay"), "model": io.folder_hash(agent_model_config(params).path),
            "corpus": io.folder_hash(corpus_dir), "session_version": SESSION_VERSION}


def variants(params: Params, suite: str) -> list[tuple[str, Params]]:
    """The suite as configured, then one variant per sweep value (`<suite>@tau=2`, `<suite>@indep=0.25`)."""
    return [(label, params.model_copy(update={"replay": config})) for label, config in params.replay.variants(suite)]


def relabel(plan: SessionPlan, label: str) -> SessionPlan:
    """A plan of a sweep variant: its suite is the variant's label and its ids say which."""
    if plan.suite == label:
        return plan
    session_id = f"{plan.session_id}@{label.split('@', 1)[1]}"
    return replace(plan, suite=label, session_id=session_id,
                   source_id=plan.source_id.replace(plan.session_id, session_id, 1))


def session_agent(params: Params) -> AgentConfig:
    """The agent settings of the lane's turns: params.agent with the lane's step and token caps."""
    return params.agent.model_copy(update={"max_iters": params.replay.max_iters,
                                           "max_new_tokens": params.replay.max_new_tokens})


@dataclass(frozen=True)
class SessionJob:
    """One session of one suite (variant), run in a pool worker."""

    params: Params
    corpus_dir: Path
    suite: str
    label: str
    index: int

    def __str__(self) -> str:
        return f"{self.label} session {self.index + 1}"


def run_job(job: SessionJob) -> SessionResult | str:
    """One session and every operator (in a worker); the reason as text when z never entered."""
    config = job.params.replay
    backend, corpus = worker_backend(agent_model_config(job.params)), worker_corpus(job.corpus_dir)
    plan, world = suite_sessions(job.suite, corpus, config)[job.index]
    try:
        return run_session(backend, world(), relabel(plan, job.label), session_agent(job.params),
                           operators=config.operators, compression_period=config.compression_period,
                           leak_at_k=config.leak_at_k, temperature=config.temperature, seed=config.seed,
                           checkpoints=config.checkpoints)
    except TargetNeverEntered as exc:
        return str(exc)


#: A suite's finished sessions: their records, turns (as trace records) and what each found.
SESSION_FILES: PartFiles[SessionRecord, TraceRecord] = PartFiles(
    records=SESSIONS_FILE, traces=TRACES_FILE, info=INFO_FILE,
    read_records=lambda path: read_sessions([path]), write_records=write_sessions,
    read_traces=lambda path: list(iter_traces(path)),
    record_part=lambda record: record.session_id, trace_part=lambda trace: trace.query_id.split("/", 1)[0])


def run_suite(params: Params, corpus: Corpus, corpus_dir: Path, suite: str, *, track: bool,
              label: str | None = None) -> SuiteScores:
    """Run (or resume) one suite (under `label`, a sweep variant's name) on a pool of
    `execution.cell_workers` processes; return its scores."""
    config = params.replay
    label = label or suite
    out = Path(config.out_dir) / label
    plans = [relabel(plan, label) for plan, _ in suite_sessions(suite, corpus, config)]
    sessions = Parts(out, SESSION_FILES, [plan.session_id for plan in plans])
    if open_unit(out, _inputs(params, corpus_dir), what=f"suite {label}"):
        sessions.resume()

    def finished(job: SessionJob, result: SessionResult | str, seconds: float) -> None:
        plan = plans[job.index]
        if isinstance(result, str):
            log.warning("%s", result)
            sessions.add(plan.session_id, {"entered": False, "reason": result}, [], [])
        else:
            sessions.add(plan.session_id, {"entered": True, "tau": result.tau, "checkpoints": result.checkpoints,
                                           "checkpoint_bytes": result.checkpoint_bytes,
                                           "checkpoint_metadata_bytes": result.checkpoint_metadata_bytes,
                                           "closures": result.closures}, result.records, result.traces)
        log.info("%s: session %s done in %.0f s (%d/%d)", label, plan.session_id, seconds, len(sessions), len(plans))

    jobs = [SessionJob(params, corpus_dir, suite, label, i) for i, plan in enumerate(plans)
            if plan.session_id not in sessions]
    failed = run_items(run_job, jobs, params.execution.cell_workers, finished)
    if failed:
        raise ReplayStageError(f"{label}: sessions failed: {'; '.join(failed)}")
    sessions.write()
    info, records, traces = sessions.infos(), sessions.records(), sessions.traces()
    missing = [sid for sid, item in info.items() if not item["entered"]]
    if not records:  # reported, never scored: the page and scores.json say that no session of the suite took z in
        log.error("%s: z never entered the state in any session (%s)", label, ", ".join(missing))
    scores = suite_scores(records, label, not_entered=missing, channels=channel_rates(traces),
                          checkpoints=checkpoint_costs(config.checkpoints, [i for i in info.values() if i["entered"]]))
    io.write_json(out / SCORES_FILE, scores.model_dump(mode="json"))
    tracking.record_output(params, out, KIND_REPLAY, label, tags={tracking.TAG_BASE_MODEL: params.base_model},
                           metrics=scores.mlflow_metrics(),
                           artifacts=[SESSIONS_FILE, SCORES_FILE, INFO_FILE, TRACES_FILE], track=track,
                           on_new_run=lambda run_id: log_sessions(records, run_id))  # a new run: its sessions as traces
    return scores


@dataclass(frozen=True)
class Options:
    """`kbench replay-run`'s options."""

    #: The corpus the sessions are planned from.
    corpus: Path = corpus_option()
    #: The suites to run; empty: `replay.suites`.
    suite: tuple[str, ...] = option((), "a session suite (repeatable; default: replay.suites)")
    #: Record each suite as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    suites = list(options.suite) or list(params.replay.suites)
    Path(params.replay.out_dir).mkdir(parents=True, exist_ok=True)
    if not suites:
        log.info("replay.suites is empty: no session to run")
        io.write_text(params.replay.results, render_no_suites(params.base_model))
        return 0
    check_design(params, suites)
    model = agent_model_config(params)
    reason = engine_reason(model.path) if model.backend == HF_BACKEND else "it is not a local model"
    if reason is not None:  # crop, checkpoint and replay act on the engine's cache
        raise ReplayStageError(f"the execution-state lane runs on the KV engine, which cannot hold {model.path}: "
                               f"{reason}; set replay.suites: [] for this model (docs/replay.md)")
    corpus = load_corpus(options.corpus)
    scores: dict[str, SuiteScores] = {}
    for suite in suites:
        for label, variant in variants(params, suite):
            scores[label] = run_suite(variant, corpus, options.corpus, suite, track=options.track, label=label)
            log.info("%s: %d sessions scored, valid %s", label, scores[label].sessions, scores[label].valid)
    pages = {label: suite.model_dump(mode="json") for label, suite in scores.items()}
    sweeps = {suite: sweep_summary(suite, pages, tau=params.replay.tau, indep=params.replay.indep) for suite in suites}
    if any(sweeps.values()):  # beside the suites' folders (each folder is one MLflow run's output)
        io.write_json(Path(params.replay.out_dir) / SWEEP_FILE, {s: v for s, v in sweeps.items() if v})
    page = render_results(pages, model=params.base_model, params_digest=io.json_digest(shaping(params, "replay")),
                          sweeps={s: v for s, v in sweeps.items() if v})
    io.write_text(params.replay.results, page)
    log.info("results page %s", params.replay.results)
    return 0
