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
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.backends import Backend, build_backend
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.parametric.agent_base import agent_model_config
from kbench.replay.operators import OperatorError, operator_names
from kbench.replay.records import FULL_RESET, SessionRecord, read_sessions, write_sessions
from kbench.replay.run import TargetNeverEntered, run_session
from kbench.replay.report import render_results
from kbench.replay.scoring import score_records
from kbench.replay.sessions import SUITES, plan_suite
from kbench.replay.traces import log_sessions
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.inputs import shaping

log = logging.getLogger(__name__)

COMMAND = "replay-run"
HELP = "run the execution-state lane: sessions, forget operators B0-B9, records and scores (replay.*)"
SESSIONS_FILE, SCORES_FILE, INFO_FILE, INPUTS_FILE = "sessions.jsonl", "scores.json", "sessions.json", "inputs.json"
KIND_REPLAY = "replay"


class ReplayStageError(ValueError):
    """An unknown suite or operator, or a design the lane cannot run."""


def check_design(params: Params, suites: list[str]) -> None:
    """Every suite and operator named exists, and B5 (the reference) is among the operators."""
    for suite in suites:
        if suite not in SUITES:
            raise ReplayStageError(f"unknown suite {suite!r}; registered: {sorted(SUITES)}")
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


def metric_key(operator: str, name: str) -> str:
    """An MLflow metric name (no quote marks): B5' is logged as B5prime."""
    return f"{operator.replace(chr(39), 'prime')}.{name}"


def run_suite(params: Params, corpus: Corpus, corpus_dir: Path, suite: str, backend: Backend, *,
              track: bool) -> dict:
    """Run (or resume) one suite; return its scores."""
    config = params.replay
    out = Path(config.out_dir) / suite
    inputs = _inputs(params, corpus_dir)
    records: list[SessionRecord] = []
    info: dict[str, dict] = {}
    if (out / INPUTS_FILE).exists() and json.loads((out / INPUTS_FILE).read_text()) == inputs and (out / SESSIONS_FILE).exists():
        records = read_sessions([out / SESSIONS_FILE])
        info = json.loads((out / INFO_FILE).read_text()) if (out / INFO_FILE).exists() else {}
    else:
        io.write_json(out / INPUTS_FILE, inputs)
    plans = plan_suite(corpus, sessions=config.sessions, kind=SUITES[suite], T=config.T, tau=config.tau,
                       indep=config.indep, n_post=config.n_post, seed=config.seed)
    for number, plan in enumerate(plans, start=1):
        if plan.session_id in info:
            continue
        log.info("%s: session %d/%d (%s)", suite, number, len(plans), plan.session_id)
        try:
            result = run_session(backend, corpus, plan, params.agent, operators=config.operators,
                                 compression_period=config.compression_period)
        except TargetNeverEntered as exc:
            log.warning("%s", exc)
            info[plan.session_id] = {"entered": False, "reason": str(exc)}
        else:
            records += result.records
            info[plan.session_id] = {"entered": True, "tau": result.tau, "checkpoints": result.checkpoints,
                                     "checkpoint_bytes": result.checkpoint_bytes, "closures": result.closures}
        write_sessions(out / SESSIONS_FILE, records)
        io.write_json(out / INFO_FILE, info)
    missing = [sid for sid, item in info.items() if not item["entered"]]
    if not records:
        raise ReplayStageError(f"{suite}: z never entered the state in any session ({', '.join(missing)})")
    scores = score_records(records)[suite]
    scores["not_entered"] = missing
    io.write_json(out / SCORES_FILE, scores)
    metrics = {metric_key(op, name): value for op, row in scores["operators"].items() for name, value in row.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    tracking.write_manifest(out, KIND_REPLAY, suite, {tracking.TAG_BASE_MODEL: params.base_model}, metrics,
                            [SESSIONS_FILE, SCORES_FILE, INFO_FILE])
    if track:
        logged = tracking.find_run_id(tracking.open_experiment(params), KIND_REPLAY, suite, io.folder_hash(out))
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
        scores[suite] = run_suite(params, corpus, options.corpus, suite, backend, track=options.track)
        log.info("%s: %d sessions scored, valid %s", suite, scores[suite]["sessions"], scores[suite]["valid"])
    page = render_results(scores, model=params.base_model, params_digest=io.json_digest(shaping(params, "replay")))
    io.write_text(params.replay.results, page)
    log.info("results page %s", params.replay.results)
    return 0
