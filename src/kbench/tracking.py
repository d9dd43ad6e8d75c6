"""The one place that talks to MLflow.

Store: the SQLite database `mlflow.db` at the repo root with artifacts under `mlruns/`
(MLflow 3.17 refuses a plain `./mlruns` file store). `MLFLOW_TRACKING_URI`, or
`tracking.tracking_uri` in params.yaml, points runs at a tracking server instead: one this
project starts (`kbench tracking-server`, `tracking_server`) or a shared one; a server that
does not answer stops the stage before any work, in one line.

Every run is tagged with its kind (corpus, cell, compare, ...), its key (for a cell:
substrate, method, seed, base model) and the git commit, and carries the content hash of
the stage output it describes. DVC's run cache can skip a stage and a fresh clone has no
`mlflow.db`, so `sync_outputs` re-logs any stage output whose hash has no run yet: a clone
plus `dvc pull` plus `dvc repro` rebuilds the same MLflow contents.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kbench import io
from kbench.config import Params, redact_url
from kbench.corpus import CORPUS_DIR, corpus_names
from kbench.names import FIELD_AWARE_RULE
from kbench.observer.metrics import read_channels
from kbench.observer.taxonomy import NameIndex, failure_mode, is_degenerate
from kbench.records import TraceRecord, iter_traces
from kbench.servers import answers, server_process

log = logging.getLogger(__name__)

TAG_KIND = "kbench.kind"
TAG_KEY = "kbench.key"
TAG_OUTPUT_HASH = "kbench.output_hash"
TAG_COMMIT = "kbench.git_commit"
#: What a run is about; a cell run carries these six and the three design tags (docs/tracking.md).
TAG_BASE_MODEL = "kbench.base_model"
TAG_SUBSTRATE = "kbench.substrate"
TAG_RECIPE = "kbench.recipe"
TAG_METHOD = "kbench.method"
TAG_SEED = "kbench.seed"
TAG_CORPUS = "kbench.corpus"
#: What makes a cell run part of a design (docs/comparison.md): the digest of the params that
#: shape every cell (`kbench.design.design_digest`), the queries per split and seed, and the
#: fingerprint of the weights the agent ran on.
TAG_DESIGN = "kbench.design"
TAG_N_PER_SPLIT = "kbench.n_per_split"
TAG_MODEL = "kbench.model_fingerprint"
TAG_CORPUS_SOURCE = "kbench.corpus_source"
TAG_INJECTION = "kbench.injection"
#: A calibration trial's end: "complete" or "pruned".
TAG_TRIAL_STATE = "kbench.trial_state"
TAG_HALTED_REASON = "kbench.halted_reason"
TAG_FAILURE_MODE = "kbench.failure_mode"
#: The assessments each trajectory's trace carries (`judge_trace`): their source id, the
#: ground truth's expectation, the failure-mode feedback and its value for a healthy answer.
FEEDBACK_SOURCE = "kbench.observer"
GROUND_TRUTH_EXPECTATION = "ground_truth"
FAILURE_FEEDBACK = "failure_mode"
NO_FAILURE = "healthy"
#: Run kinds (TAG_KIND), one per stage output and tool that logs a run.
KIND_CORPUS, KIND_AGENT_BASE, KIND_INJECT, KIND_CELL, KIND_COMPARE = "corpus", "agent_base", "inject", "cell", "compare"
KIND_FIT = "fit"
KIND_UNLEARN = "unlearn"
KIND_PROBE = "probe"
#: A cell of a weight method: the key and content hash of the unlearn run whose weights it deployed.
TAG_UNLEARN_KEY = "kbench.unlearn_key"
TAG_UNLEARNED_HASH = "kbench.unlearned_hash"
#: The budget keys a weight method's run set differently from `unlearning` (JSON; "{}": none).
TAG_BUDGET_EXCEPTIONS = "kbench.budget_exceptions"
KIND_CALIBRATE, KIND_CALIBRATE_TRIAL = "calibrate", "calibrate_trial"
#: A stage output folder that MLflow can rebuild from holds this manifest.
RUN_MANIFEST = "run.json"
#: Trace records in a stage output are also logged as MLflow traces (one per trajectory).
TRAJECTORIES_FILE = "traces.jsonl"


def repo_root() -> Path:
    """The project root: $KBENCH_ROOT, else the working directory (DVC runs stages there)."""
    return Path(os.environ.get("KBENCH_ROOT", os.getcwd())).resolve()


def tracking_uri(params: Params | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if params is not None and params.tracking.tracking_uri:
        return params.tracking.tracking_uri
    return f"sqlite:///{repo_root() / 'mlflow.db'}"


class TrackingError(OSError):
    """The tracking server named by the tracking URI does not answer, or cannot be started."""


#: The tracking server's own stores under the project (`kbench tracking-server`): runs in a SQL
#: database, artifacts uploaded through the server (so clients on other machines can log them).
SERVER_STORE, SERVER_ARTIFACTS = "mlflow-server.db", "mlartifacts"


def check_server(uri: str) -> None:
    """An http(s) tracking URI answers MLflow's health check, or one TrackingError naming it
    (MLflow's own client would retry for minutes before failing)."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return
    if not answers(f"{uri.rstrip('/')}/health", timeout=3.0):
        raise TrackingError(f"the MLflow tracking server at {redact_url(uri)} does not answer (GET /health); start "
                            "it (`kbench tracking-server`) or unset MLFLOW_TRACKING_URI to log to mlflow.db")


def server_command(root: Path, host: str, port: int) -> list[str]:
    """`mlflow server` on the project's server stores under `root`, bound to `host`:`port`."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / SERVER_STORE}",
            "--artifacts-destination", str(root / SERVER_ARTIFACTS), "--host", host, "--port", str(port),
            "--workers", "1"]


@contextmanager
def tracking_server(root: Path, port: int, *, host: str = "127.0.0.1", startup_timeout: float = 120.0) -> Iterator[str]:
    """An MLflow tracking server on `host`:`port` for the duration; yields its URI (the value for
    MLFLOW_TRACKING_URI) and stops it on exit."""
    uri = f"http://{host}:{port}"
    if answers(f"{uri}/health", timeout=1.0):
        raise TrackingError(f"something already answers at {uri}: choose another port (--port)")
    with server_process(server_command(root, host, port), f"{uri}/health", name="the MLflow tracking server",
                        error=TrackingError, startup_timeout=startup_timeout):
        log.info("MLflow tracking server at %s (runs in %s, artifacts in %s/)", uri, root / SERVER_STORE,
                 root / SERVER_ARTIFACTS)
        yield uri


#: Where `dvc exp run --queue` / `--temp` run an experiment (a copy of the project, deleted after).
DVC_TEMP_WORKSPACE = "/.dvc/tmp/exps/"


def _quiet_mlflow() -> None:
    # Alembic prints every schema migration at INFO when a fresh SQLite store is created.
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent"):
        logging.getLogger(name).setLevel(logging.WARNING)


def open_experiment(params: Params) -> str:
    """Point MLflow at the store and return the experiment id (created on first use)."""
    import mlflow

    _quiet_mlflow()
    uri = tracking_uri(params)
    check_server(uri)
    if uri.startswith("sqlite:") and DVC_TEMP_WORKSPACE in repo_root().as_posix():
        log.warning("this stage runs in a DVC experiment's temporary workspace (dvc queue / --temp): its MLflow "
                    "store %s goes when the workspace does; set MLFLOW_TRACKING_URI to a tracking server "
                    "(`kbench tracking-server`) to keep the runs", uri)
    mlflow.set_tracking_uri(uri)
    name = params.tracking.experiment
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    elif uri.startswith("sqlite:"):
        artifacts = repo_root() / "mlruns"
        artifacts.mkdir(exist_ok=True)
        experiment_id = mlflow.create_experiment(name, artifact_location=artifacts.as_uri())
    else:
        experiment_id = mlflow.create_experiment(name)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested params as dotted keys with string values (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return flat


def find_run_id(experiment_id: str, kind: str, key: str, digest: str | None = None) -> str | None:
    """The newest run of this kind and key (and output hash, when given), or None."""
    import mlflow

    query = f"tags.`{TAG_KIND}` = '{kind}' and tags.`{TAG_KEY}` = '{key}'"
    if digest is not None:
        query += f" and tags.`{TAG_OUTPUT_HASH}` = '{digest}'"
    runs = mlflow.search_runs(
        experiment_ids=[experiment_id], filter_string=query,
        order_by=["attributes.start_time DESC"], max_results=1, output_format="list",
    )
    return runs[0].info.run_id if runs else None


@contextmanager
def start_run(
    params: Params, kind: str, key: str, *, tags: Mapping[str, str] | None = None,
    run_name: str | None = None, nested: bool = False,
    stopped_by: tuple[type[BaseException], ...] = (),
    log_params: bool = True,
) -> Iterator[Any]:
    """An MLflow run tagged with kind, key and commit, with params.yaml logged (flattened) unless
    `log_params` is false.

    An exception of a `stopped_by` type (an expected early stop, such as Optuna's TrialPruned)
    ends the run KILLED and propagates; any other exception ends it FAILED, as MLflow does.
    """
    import mlflow

    open_experiment(params)
    all_tags = {TAG_KIND: kind, TAG_KEY: key, TAG_COMMIT: git_commit(), **(tags or {})}
    stopped = None
    with mlflow.start_run(run_name=run_name or f"{kind}:{key}", tags=all_tags, nested=nested) as run:
        if not nested and log_params:
            flat = flatten(params.model_dump())
            items = list(flat.items())
            for start in range(0, len(items), 100):
                mlflow.log_params(dict(items[start : start + 100]))
        try:
            yield run
        except stopped_by as stop:
            # Leave MLflow's `with` normally (an exception there ends the run FAILED, and ending
            # a nested run by hand would hand the parent to its exit), then mark this run.
            stopped = stop
    if stopped is not None:
        mlflow.MlflowClient().set_terminated(run.info.run_id, "KILLED")
        raise stopped


def write_manifest(
    folder: Path, kind: str, key: str, tags: Mapping[str, str], metrics: Mapping[str, float],
    artifacts: list[str] | None = None, curves: Mapping[str, list[float | None]] | None = None,
) -> None:
    """Describe a finished stage output so `sync_outputs` can log it again in another clone.

    `artifacts` names the files (relative to the folder) to log; None logs them all. A
    stage whose output is a model folder names only its small reports. `curves` are metrics
    logged once per step (a training curve; a None entry is a step without that value).
    """
    manifest = {"kind": kind, "key": key, "tags": dict(tags), "metrics": dict(metrics), "artifacts": artifacts}
    if curves:
        manifest["curves"] = {name: list(values) for name, values in curves.items()}
    io.write_json(folder / RUN_MANIFEST, manifest)


def log_output(params: Params, folder: Path, *, artifact_path: str = "output") -> str:
    """Log a stage output folder (its manifest, metrics and files) as one run; return its id.

    Idempotent: a run with the same kind, key and output hash is reused, not duplicated. An
    output of another base model (its manifest's tag; synced from that model's own folders) is
    logged without `params`, which are not the ones it was made under.
    """
    return _log_output(params, folder, artifact_path)[0]


def _log_output(params: Params, folder: Path, artifact_path: str = "output") -> tuple[str, bool]:
    """`log_output`, and whether its run is new (no run held this output before)."""
    import mlflow

    manifest = json.loads((folder / RUN_MANIFEST).read_text())
    digest = io.folder_hash(folder)
    experiment_id = open_experiment(params)
    existing = find_run_id(experiment_id, manifest["kind"], manifest["key"], digest)
    if existing:
        return existing, False
    tags = {**manifest["tags"], TAG_OUTPUT_HASH: digest}
    own = manifest["tags"].get(TAG_BASE_MODEL, params.base_model) == params.base_model
    with start_run(params, manifest["kind"], manifest["key"], tags=tags, log_params=own) as run:
        numeric = {k: float(v) for k, v in manifest["metrics"].items() if v is not None}
        if numeric:
            mlflow.log_metrics(numeric)
        for name, values in (manifest.get("curves") or {}).items():
            for step, value in enumerate(values, start=1):
                if value is not None:
                    mlflow.log_metric(name, float(value), step=step)
        names = manifest.get("artifacts")
        if names is None:
            mlflow.log_artifacts(str(folder), artifact_path=artifact_path)
        else:
            for name in [RUN_MANIFEST, *names]:
                mlflow.log_artifact(str(folder / name), artifact_path=artifact_path)
        traces = folder / TRAJECTORIES_FILE
        if traces.exists() and (names is None or TRAJECTORIES_FILE in names):
            log_trajectories(iter_traces(traces), run.info.run_id, rule=params.scoring.rule,
                             names=corpus_names(repo_root() / CORPUS_DIR))
        return run.info.run_id, True


def record_output(
    params: Params, folder: Path, kind: str, key: str, *, tags: Mapping[str, str], metrics: Mapping[str, float],
    artifacts: list[str] | None = None, track: bool = True, curves: Mapping[str, list[float | None]] | None = None,
    on_new_run: Callable[[str], None] | None = None,
) -> str | None:
    """A finished stage output: its manifest, then (with `track`) its MLflow run; the run id or None.
    `on_new_run(run_id)` runs when no run held this output before (a lane then logs its traces)."""
    write_manifest(folder, kind, key, tags, metrics, artifacts, curves)
    if not track:
        return None
    run_id, new = _log_output(params, folder)
    if on_new_run is not None and new:
        on_new_run(run_id)
    return run_id


def sync_outputs(params: Params, roots: list[Path]) -> list[str]:
    """Log every stage output under `roots` that has no run with its content hash yet."""
    run_ids = []
    for root in roots:
        if not root.exists():
            continue
        for manifest in sorted(root.rglob(RUN_MANIFEST)):
            run_ids.append(log_output(params, manifest.parent))
    return run_ids


def leak_feedback(channel: str) -> str:
    """The name of the feedback that says whether `channel` leaked on a trace (`leak_Z_answer`)."""
    return f"leak_{channel}"


def log_trajectories(records: Iterable[TraceRecord], run_id: str, *, rule: str = FIELD_AWARE_RULE,
                     names: NameIndex | None = None) -> int:
    """Log each trajectory as an MLflow trace linked to the run, for the UI's Traces tab, with
    the observer's judgement on it (`judge_trace`).

    Shape: an AGENT span per query with one LLM span per ReAct step (what the model wrote),
    a TOOL span under it for the action and the observation the harness returned, and an
    LLM span for the elicited summary. Tags: the halted reason and the failure mode.
    """
    import mlflow
    from mlflow.entities import SpanType

    logged: list[tuple[str, TraceRecord, str | None]] = []
    for record in records:
        mode = failure_mode(record, names)
        with mlflow.start_span(name=f"agent {record.query_id}", span_type=SpanType.AGENT, run_id=run_id) as root:
            mlflow.update_current_trace(tags={TAG_HALTED_REASON: record.halted_reason,
                                              TAG_FAILURE_MODE: mode or NO_FAILURE})
            root.set_inputs({"query_id": record.query_id, "split": record.split, "field": record.field})
            root.set_attributes({
                TAG_SUBSTRATE: record.substrate, TAG_METHOD: record.method,
                TAG_SEED: record.seed, TAG_HALTED_REASON: record.halted_reason,
            })
            for index, step in enumerate(record.steps, start=1):
                with mlflow.start_span(name=f"step {index}", span_type=SpanType.LLM) as llm:
                    llm.set_outputs({"thought": step.thought, "action": step.action.model_dump() if step.action else None})
                    if step.action is not None:
                        with mlflow.start_span(name=step.action.tool, span_type=SpanType.TOOL) as tool:
                            tool.set_inputs({"args": step.action.args})
                            tool.set_outputs({"observation": step.observation})
            if record.retrieval:
                with mlflow.start_span(name="retrieval log", span_type=SpanType.RETRIEVER) as retriever:
                    retriever.set_outputs([r.model_dump() for r in record.retrieval])
            with mlflow.start_span(name="elicited summary", span_type=SpanType.LLM) as summary:
                summary.set_outputs({"summary": record.summary, "summary_error": record.summary_error})
            root.set_outputs({"answer": record.answer, "halted_reason": record.halted_reason})
        logged.append((root.trace_id, record, mode))
    if logged:
        mlflow.flush_trace_async_logging()  # assessments attach to traces the store holds
    for trace_id, record, mode in logged:
        judge_trace(trace_id, record, mode, rule)
    return len(logged)


def judge_trace(trace_id: str, record: TraceRecord, mode: str | None, rule: str = FIELD_AWARE_RULE) -> None:
    """The observer's judgement as MLflow assessments of source CODE on one trace: a feedback
    per observed channel (`leak_feedback`: leaked or not, its severity in the metadata), the
    ground truth as an expectation, and the failure mode (`NO_FAILURE` for a healthy answer)
    with the halted reason. A channel dropped on the trajectory gets no feedback."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    source = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=FEEDBACK_SOURCE)
    for channel, found in read_channels(record, rule).items():
        if found is not None:
            mlflow.log_feedback(trace_id=trace_id, name=leak_feedback(channel), value=bool(found.leaked),
                                source=source, metadata={"severity": f"{found.severity:.4f}", "rule": rule})
    mlflow.log_expectation(trace_id=trace_id, name=GROUND_TRUTH_EXPECTATION, value=record.ground_truth,
                           source=source, metadata={"field": record.field})
    mlflow.log_feedback(trace_id=trace_id, name=FAILURE_FEEDBACK, value=mode or NO_FAILURE, source=source,
                        metadata={"halted_reason": record.halted_reason, "degenerate": str(is_degenerate(record)).lower()})
