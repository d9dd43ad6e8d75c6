"""`kbench calibrate`: an Optuna search of injection strength (docs/parametric.md).

Each trial trains the LoRA-T+D recipe with sampled epochs, learning rate and rank on the
training set of the `inject` stage and is scored on the forget adapter pool, which the
adapter learns and the cells never query:

- memorization: the mean of the direct probe (greedy answer to the canonical question holds
  the value, every field of every probed entity) and the summary channel of the deployed
  agent (its elicited summary holds the asked value);
- health: the agent's degeneration rate (docs/definitions.md, "Cell metrics") with the trial adapter against the
  un-injected agent on the same queries, both on R-struct, where the record tools, like
  substrate P's, hold no record of an adapter-pool entity.

objective = |memorization - target_recall| + degeneration_penalty x max(0, degeneration
excess over the un-injected agent - degeneration_bound), minimised. The direct probe is
reported after every epoch as |recall - target| so a MedianPruner stops trials that trail
the others at the same epoch. The study lives in `<study_dir>/study.db` (SQLite) and resumes;
each trial is a nested MLflow run under one parent run per invocation; the best values go to
`<study_dir>/best.json` and, with `--write`, into params.yaml's `injection` section, which the
`inject` stage reads, so `dvc repro` retrains with them.
"""

from __future__ import annotations

import logging
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbench import io, tracking
from kbench.agent import setup_cell
from kbench.backends.hf import load_tokenizer
from kbench.config import ModelConfig, Params, load_params
from kbench.corpus import Corpus
from kbench.names import BASELINE_METHOD, STRUCT_RETRIEVAL
from kbench.observer.matcher import match
from kbench.observer.taxonomy import is_degenerate
from kbench.parametric.adapters import TARGET, base_fingerprint
from kbench.parametric.injection import FORGET_ADAPTER_POOL, adapter_pool, train_injection, training_entities
from kbench.parametric.recall import direct_recall
from kbench.records import FIELDS, FORGET, Entity, Query, TraceRecord

log = logging.getLogger(__name__)

STUDY_FILE = "study.db"
BEST_FILE = "best.json"
#: params.yaml keys under `injection.lora` a calibration sets.
CALIBRATED_KEYS = ("epochs", "learning_rate", "rank", "alpha")
#: Study attribute caching the un-injected agent's degeneration (the same for every trial).
_BASELINE_ATTR = "baseline_degeneration"


@dataclass(frozen=True)
class CalibrationInputs:
    params: Params
    corpus: Corpus
    #: The agent's model (kbench.parametric.agent_base.agent_model_config): the base every trial adapts.
    model: ModelConfig
    #: The R-text index (its distractor passages answer `search_wiki`); None: no passage at all.
    index_dir: Path | None

    @property
    def base_dir(self) -> Path:
        return Path(self.model.path)


def health_queries(inputs: CalibrationInputs) -> list[Query]:
    """A seeded sample of canonical queries about forget-adapter-pool entities."""
    calibration = inputs.params.injection.calibration
    pool = adapter_pool(inputs.corpus, inputs.params, FORGET_ADAPTER_POOL)
    candidates = [Query.make_id(e, f) for e in pool for f in FIELDS]
    n = min(calibration.health_queries, len(candidates))
    picked = random.Random(calibration.sampler_seed).sample(candidates, n)
    return [inputs.corpus.query(q) for q in sorted(picked)]


def probe_entities(inputs: CalibrationInputs) -> list[Entity]:
    """The learned forget-adapter-pool entities, every field of which the direct probe asks."""
    return [inputs.corpus.entities[e] for e in adapter_pool(inputs.corpus, inputs.params, FORGET_ADAPTER_POOL)]


def run_health(inputs: CalibrationInputs, adapter_dir: Path | None) -> list[TraceRecord]:
    """The deployed agent (R-struct, method none) on the health queries, with or without the adapter."""
    params = inputs.params
    agent = setup_cell(
        params, inputs.corpus, inputs.model, substrate=STRUCT_RETRIEVAL, method=BASELINE_METHOD,
        seed=params.injection.lora.seed, index_dir=inputs.index_dir,
        adapter_path=str(adapter_dir) if adapter_dir is not None else None,
    )
    records: list[TraceRecord] = []
    agent.run([(q, FORGET) for q in health_queries(inputs)], records.append)
    return records


def degeneration(records: list[TraceRecord]) -> float:
    return sum(is_degenerate(r) for r in records) / len(records)


def summary_channel_recall(records: list[TraceRecord]) -> float:
    """Fraction of trajectories whose elicited summary holds the asked value."""
    return sum(match(r.field, r.ground_truth, r.summary or "").leaked for r in records) / len(records)


def objective_value(memorization: float, degeneration_excess: float, params: Params) -> float:
    calibration = params.injection.calibration
    overshoot = max(0.0, degeneration_excess - calibration.degeneration_bound)
    return abs(memorization - calibration.target_recall) + calibration.degeneration_penalty * overshoot


def suggest(trial: Any, params: Params) -> dict[str, Any]:
    """Trial values of the calibrated keys; alpha keeps the configured alpha / rank ratio."""
    calibration = params.injection.calibration
    values = {
        "epochs": trial.suggest_int("epochs", *calibration.epochs),
        "learning_rate": trial.suggest_float("learning_rate", *calibration.learning_rate, log=True),
        "rank": trial.suggest_categorical("rank", calibration.ranks),
    }
    return with_alpha(values, params)


def with_alpha(values: dict[str, Any], params: Params) -> dict[str, Any]:
    """Trial values plus the alpha that keeps the configured alpha / rank ratio."""
    lora = params.injection.lora
    return {**values, "alpha": max(1, round(values["rank"] * lora.alpha / lora.rank))}


def make_objective(inputs: CalibrationInputs, baseline_degeneration: float):
    """The Optuna objective: train, report per epoch, probe, run the agent, log a nested run."""
    import mlflow
    import optuna

    params = inputs.params
    calibration = params.injection.calibration
    entities = training_entities(inputs.corpus, params)[TARGET]
    probed = probe_entities(inputs)
    base_model = params.base_model
    tokenizer = load_tokenizer(inputs.base_dir)

    def objective(trial: optuna.Trial) -> float:
        values = suggest(trial, params)
        key = f"{base_model}/trial-{trial.number}"
        # A pruned trial's run ends KILLED: in the MLflow UI it is stopped, not broken.
        with tracking.start_run(params, tracking.KIND_CALIBRATE_TRIAL, key, nested=True, stopped_by=(optuna.TrialPruned,)):
            mlflow.log_params({f"injection.lora.{k}": v for k, v in values.items()})

            def on_epoch(epoch: int, model: Any, loss: float) -> None:
                recall = direct_recall(model, tokenizer, probed, batch_size=params.injection.recall_batch_size)
                mlflow.log_metrics({"epoch_loss": loss, "direct_recall": recall}, step=epoch)
                trial.report(abs(recall - calibration.target_recall), epoch)
                if trial.should_prune():
                    mlflow.set_tag(tracking.TAG_TRIAL_STATE, "pruned")
                    raise optuna.TrialPruned(f"epoch {epoch}: direct recall {recall:.2f}")

            run, _ = train_injection(params, inputs.corpus, inputs.base_dir, entities, on_epoch=on_epoch, **values)
            direct = direct_recall(run.model, tokenizer, probed, batch_size=params.injection.recall_batch_size)
            with tempfile.TemporaryDirectory() as scratch:
                run.model.save_pretrained(scratch)
                records = run_health(inputs, Path(scratch))
            summary = summary_channel_recall(records)
            degenerate = degeneration(records)
            memorization = (direct + summary) / 2
            value = objective_value(memorization, degenerate - baseline_degeneration, params)
            metrics = {
                "direct_recall": direct, "summary_recall": summary, "memorization": memorization,
                "degeneration": degenerate, "degeneration_excess": degenerate - baseline_degeneration,
                "final_loss": run.step_losses[-1], "objective": value,
            }
            mlflow.log_metrics(metrics)
            mlflow.set_tag(tracking.TAG_TRIAL_STATE, "complete")
            for name, metric in metrics.items():
                trial.set_user_attr(name, metric)
            log.info("trial %d %s: %s", trial.number, values, metrics)
            return value

    return objective


def open_study(inputs: CalibrationInputs) -> Any:
    """The persistent study of this base model and corpus (created on first use, resumed after);
    another base or corpus gets a study of its own in the same file."""
    import optuna

    calibration = inputs.params.injection.calibration
    study_dir = Path(calibration.study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    return optuna.create_study(
        study_name=f"injection-{base_fingerprint(inputs.base_dir)}-{inputs.corpus.fingerprint()}",
        storage=f"sqlite:///{(study_dir / STUDY_FILE).resolve()}",
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=calibration.sampler_seed),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=calibration.pruner_startup_trials, n_warmup_steps=calibration.pruner_warmup_epochs,
        ),
        load_if_exists=True,
    )


def calibrate(inputs: CalibrationInputs) -> dict[str, Any]:
    """Run the study until it holds `n_trials` finished trials; return and save the best values."""
    import optuna

    params = inputs.params
    calibration = params.injection.calibration
    study = open_study(inputs)
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    finished = [t for t in study.trials if t.state in ended]
    base_model = params.base_model
    with tracking.start_run(params, tracking.KIND_CALIBRATE, f"{base_model}/injection"):
        import mlflow

        if _BASELINE_ATTR not in study.user_attrs:
            study.set_user_attr(_BASELINE_ATTR, degeneration(run_health(inputs, None)))
        baseline = study.user_attrs[_BASELINE_ATTR]
        mlflow.log_metric("baseline_degeneration", baseline)
        remaining = calibration.n_trials - len(finished)
        if remaining > 0:
            study.optimize(make_objective(inputs, baseline), n_trials=remaining, catch=())
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            raise ValueError("no calibration trial completed (all pruned or failed); widen injection.calibration")
        best = study.best_trial
        result = {
            "values": with_alpha(best.params, params),
            "objective": best.value,
            "trial": best.number,
            "metrics": best.user_attrs,
            "baseline_degeneration": baseline,
            "n_trials": len(study.trials),
        }
        mlflow.log_metrics({"best_objective": best.value, "n_trials": float(len(study.trials))})
        mlflow.log_params({f"best.{k}": v for k, v in result["values"].items()})
    best_path = Path(calibration.study_dir) / BEST_FILE
    io.write_json(best_path, result)
    return result


def _block(lines: list[str], key: str, start: int, end: int, indent: str) -> tuple[int, int]:
    """(header line, end) of the mapping `key:` at `indent` within lines[start:end]; appended if absent."""
    header = re.compile(rf"^{indent}{key}:\s*(#.*)?$")
    found = next((i for i in range(start, end) if header.match(lines[i])), None)
    if found is None:
        lines.insert(end, f"{indent}{key}:")
        return end, end + 1
    child = re.compile(rf"^{indent}\s+\S")
    stop = next((i for i in range(found + 1, end) if lines[i].strip() and not child.match(lines[i])), end)
    return found, stop


def write_calibrated(params_path: Path, values: dict[str, Any]) -> None:
    """Set the calibrated keys of `injection.lora` in place, keeping every comment."""
    lines = params_path.read_text(encoding="utf-8").splitlines()
    section, section_end = _block(lines, "injection", 0, len(lines), "")
    lora, end = _block(lines, "lora", section + 1, section_end, "  ")
    for key in CALIBRATED_KEYS:
        pattern = re.compile(rf"^(    {key}:\s*)([^#]*?)(\s*#.*)?$")
        found = next((i for i in range(lora + 1, end) if pattern.match(lines[i])), None)
        if found is None:
            lines.insert(end, f"    {key}: {values[key]}")
            end += 1
        else:
            head, _, comment = pattern.match(lines[found]).groups()
            lines[found] = f"{head}{values[key]}{comment or ''}"
    io.write_text(params_path, "\n".join(lines) + "\n")
    load_params(params_path)
