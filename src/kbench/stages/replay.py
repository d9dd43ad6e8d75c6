"""The `replay` stage (`kbench replay-run`): the execution-state lane (SPEC §14; docs/replay.md).

For each suite of `replay.suites`, the sessions are planned from the corpus, run on the agent
base with the KV engine, and every operator of `replay.operators` acts on each; the records go
to `replay.out_dir/<suite>/sessions.jsonl` (one per session × operator), the lane's scores to
`scores.json`, what the provenance found per session to `sessions.json`, and the suite is
logged as an MLflow run (each operator's metrics under its id). Sessions are written as they
finish (atomically); a rerun with the same inputs keeps them and runs the rest.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from kbench import io, tracking
from kbench.backends import Backend, build_backend
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.parametric.agent_base import agent_model_config
from kbench.records import TraceRecord, iter_traces
from kbench.replay.channels import channel_rates
from kbench.replay.operators import OperatorError, operator_names
from kbench.replay.records import FULL_RESET, SessionRecord, read_sessions, write_sessions
from kbench.replay.run import TargetNeverEntered, run_session
from kbench.replay.report import render_results, sweep_summary
from kbench.replay.sessions import SessionPlan
from kbench.replay.scoring import score_records
from kbench.replay.suites import check_suite, suite_sessions
from kbench.replay.traces import log_sessions
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.inputs import shaping

log = logging.getLogger(__name__)

COMMAND = "replay-run"
HELP = "run the execution-state lane: sessions, forget operators B0-B9, records and scores (replay.*)"
SESSIONS_FILE, SCORES_FILE, INFO_FILE, INPUTS_FILE = "sessions.jsonl", "scores.json", "sessions.json", "inputs.json"
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
    """What a finished session depends on: the shaping params, the agent base and the corpus."""
    return {"params": shaping(params, "replay"), "model": io.folder_hash(agent_model_config(params).path),
            "corpus": io.folder_hash(corpus_dir)}


def variants(params: Params, suite: str) -> list[tuple[str, Params]]:
    """The suite as configured, then one variant per sweep value (`<suite>@tau=2`, `<suite>@indep=0.25`)."""
    config = params.replay
    found = [(suite, params)]
    for key, values in (("tau", config.tau_sweep), ("indep", config.indep_sweep)):
        for value in values:
            changed = config.model_copy(update={key: value, "tau_sweep": [], "indep_sweep": []})
            found.append((f"{suite}@{key}={value}", params.model_copy(update={"replay": changed})))
    return found


def relabel(plan: SessionPlan, label: str) -> SessionPlan:
    """A plan of a sweep variant: its suite is the variant's label and its ids say which."""
    if plan.suite == label:
        return plan
    session_id = f"{plan.session_id}@{label.split('@', 1)[1]}"
    return replace(plan, suite=label, session_id=session_id,
                   source_id=plan.source_id.replace(plan.session_id, session_id, 1))


def metric_key(operator: str, name: str) -> str:
    """An MLflow metric name (no quote marks): B5' is logged as B5prime."""
    return f"{operator.replace(chr(39), 'prime')}.{name}"


def run_suite(params: Params, corpus: Corpus, corpus_dir: Path, suite: str, backend: Backend, *,
              track: bool, label: str | None = None) -> dict:
    """Run (or resume) one suite (under `label`, a sweep variant's name); return its scores."""
    config = params.replay
    label = label or suite
    out = Path(config.out_dir) / label
    inputs = _inputs(params, corpus_dir)
    records: list[SessionRecord] = []
    traces: list[TraceRecord] = []
    info: dict[str, dict] = {}
    if (out / INPUTS_FILE).exists() and json.loads((out / INPUTS_FILE).read_text()) == inputs and (out / SESSIONS_FILE).exists():
        records = read_sessions([out / SESSIONS_FILE])
        traces = list(iter_traces(out / TRACES_FILE)) if (out / TRACES_FILE).exists() else []
        info = json.loads((out / INFO_FILE).read_text()) if (out / INFO_FILE).exists() else {}
    else:
        io.write_json(out / INPUTS_FILE, inputs)
    plans = suite_sessions(suite, corpus, config)
    for number, (plan, world) in enumerate(plans, start=1):
        plan = relabel(plan, label)
        if plan.session_id in info:
            continue
        log.info("%s: session %d/%d (%s)", label, number, len(plans), plan.session_id)
        try:
            result = run_session(backend, world(), plan, params.agent, operators=config.operators,
                                 compression_period=config.compression_period, leak_at_k=config.leak_at_k,
                                 temperature=config.temperature, seed=config.seed)
        except TargetNeverEntered as exc:
            log.warning("%s", exc)
            info[plan.session_id] = {"entered": False, "reason": str(exc)}
        else:
            records += result.records
            traces += result.traces
            info[plan.session_id] = {"entered": True, "tau": result.tau, "checkpoints": result.checkpoints,
                                     "checkpoint_bytes": result.checkpoint_bytes, "closures": result.closures}
        write_sessions(out / SESSIONS_FILE, records)
        io.write_jsonl(out / TRACES_FILE, traces)
        io.write_json(out / INFO_FILE, info)
    missing = [sid for sid, item in info.items() if not item["entered"]]
    if not records:
        raise ReplayStageError(f"{label}: z never entered the state in any session ({', '.join(missing)})")
    scores = score_records(records)[label]
    scores["not_entered"] = missing
    scores["channels"] = channel_rates(traces)
    io.write_json(out / SCORES_FILE, scores)
    metrics = {metric_key(op, name): value for op, row in scores["operators"].items() for name, value in row.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    tracking.write_manifest(out, KIND_REPLAY, label, {tracking.TAG_BASE_MODEL: params.base_model}, metrics,
                            [SESSIONS_FILE, SCORES_FILE, INFO_FILE, TRACES_FILE])
    if track:
        logged = tracking.find_run_id(tracking.open_experiment(params), KIND_REPLAY, label, io.folder_hash(out))
        run_id = tracking.log_output(params, out)
        if logged is None:  # a new run: its sessions as traces
            log_sessions(records, run_id)
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
        return 0
    check_design(params, suites)
    corpus = load_corpus(options.corpus)
    backend = build_backend(agent_model_config(params))
    scores = {}
    for suite in suites:
        for label, variant in variants(params, suite):
            scores[label] = run_suite(variant, corpus, options.corpus, suite, backend, track=options.track, label=label)
            log.info("%s: %d sessions scored, valid %s", label, scores[label]["sessions"], scores[label]["valid"])
    sweeps = {suite: sweep_summary(suite, scores) for suite in suites}
    if any(sweeps.values()):  # beside the suites' folders (each folder is one MLflow run's output)
        io.write_json(Path(params.replay.out_dir) / SWEEP_FILE, {s: v for s, v in sweeps.items() if v})
    page = render_results(scores, model=params.base_model, params_digest=io.json_digest(shaping(params, "replay")),
                          sweeps={s: v for s, v in sweeps.items() if v})
    io.write_text(params.replay.results, page)
    log.info("results page %s", params.replay.results)
    return 0
