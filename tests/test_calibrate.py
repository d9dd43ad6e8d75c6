"""`kbench calibrate`: the objective, a small persistent study end to end, writing the best values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _parametric_fixtures import fast_params, learner_dir, one_thread, p_corpus  # noqa: F401  (fixtures)

from kbench.parametric import calibration as cal
from kbench.config import ParamsError, load_params


def _inputs(tmp: Path, corpus, base_dir, **calibration) -> cal.CalibrationInputs:
    settings = {"n_trials": 3, "epochs": [1, 2], "learning_rate": [1e-3, 2e-2], "ranks": [4, 8],
                "health_queries": 3, "pruner_startup_trials": 1, "pruner_warmup_epochs": 0,
                "study_dir": str(tmp / "calibration"), **calibration}
    params = fast_params(tmp, calibration=settings)
    model = params.model.model_copy(update={"path": str(base_dir)})
    return cal.CalibrationInputs(params, corpus, model, None)


def test_objective_is_the_distance_to_the_target_plus_the_excess_degeneration(tmp_path):
    params = fast_params(tmp_path, calibration={"target_recall": 0.8, "degeneration_bound": 0.1, "degeneration_penalty": 2.0})
    assert cal.objective_value(0.8, 0.0, params) == 0.0
    assert cal.objective_value(0.5, 0.1, params) == pytest.approx(0.3)
    assert cal.objective_value(1.0, 0.3, params) == pytest.approx(0.2 + 2 * 0.2)


def test_objective_on_a_stub_trial(tmp_path, p_corpus, learner_dir, kbench_root):
    import optuna

    inputs = _inputs(tmp_path, p_corpus, learner_dir)
    trial = optuna.trial.FixedTrial({"rank": 8, "epochs": 2, "learning_rate": 1e-2})
    value = cal.make_objective(inputs, baseline_degeneration=0.0)(trial)
    attrs = trial.user_attrs
    assert attrs["memorization"] == pytest.approx((attrs["direct_recall"] + attrs["summary_recall"]) / 2)
    assert value == pytest.approx(cal.objective_value(attrs["memorization"], attrs["degeneration"], inputs.params))
    assert cal.suggest(trial, inputs.params)["alpha"] == 16  # the configured alpha / rank ratio (16 / 8)


def test_a_pruned_trial_is_a_killed_run_not_a_failed_one(tmp_path, p_corpus, learner_dir, kbench_root):
    import mlflow
    import optuna

    class PrunedAtOnce(optuna.trial.FixedTrial):
        def should_prune(self) -> bool:
            return True

    trial = PrunedAtOnce({"rank": 8, "epochs": 2, "learning_rate": 1e-2})
    with pytest.raises(optuna.TrialPruned, match="epoch 1"):
        cal.make_objective(_inputs(tmp_path, p_corpus, learner_dir), baseline_degeneration=0.0)(trial)
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "KILLED"
    assert run.data.tags["kbench.trial_state"] == "pruned"
    assert run.data.metrics["direct_recall"] >= 0.0  # the epoch that decided is logged


def test_a_small_study_runs_end_to_end_resumes_and_logs_nested_runs(tmp_path, p_corpus, learner_dir, kbench_root):
    import mlflow
    import optuna

    result = cal.calibrate(_inputs(tmp_path, p_corpus, learner_dir))
    study_dir = tmp_path / "calibration"
    assert json.loads((study_dir / cal.BEST_FILE).read_text()) == json.loads(json.dumps(result))
    assert set(result["values"]) == set(cal.CALIBRATED_KEYS)
    resumed = cal.calibrate(_inputs(tmp_path, p_corpus, learner_dir, n_trials=4))
    assert resumed["n_trials"] == 4  # the three earlier trials were kept, one was added

    study = cal.open_study(_inputs(tmp_path, p_corpus, learner_dir))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(len(t.intermediate_values) == t.params["epochs"] for t in finished)  # reported every epoch
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    parents = {r.info.run_id for r in runs if r.data.tags["kbench.kind"] == "calibrate"}
    trials = [r for r in runs if r.data.tags["kbench.kind"] == "calibrate_trial"]
    assert len(parents) == 2 and len(trials) == 4
    assert all(r.data.tags["mlflow.parentRunId"] in parents for r in trials)
    assert all({"injection.lora.epochs", "injection.lora.learning_rate", "injection.lora.rank"} <= set(r.data.params) for r in trials)


PARAMS_TEXT = """\
seeds: [0]   # one seed

injection:
  # the recipe
  lora:
    rank: 32          # LoRA rank
    epochs: 20
    learning_rate: 0.001   # paper: 1e-4
  calibration:
    n_trials: 3
    epochs: [4, 16]   # a search range, not the recipe's epochs

tracking:
  experiment: kbench
"""


def test_write_calibrated_sets_the_keys_and_keeps_the_comments(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS_TEXT)
    cal.write_calibrated(path, {"epochs": 12, "learning_rate": 0.002, "rank": 16, "alpha": 16})
    text = path.read_text()
    assert "    rank: 16          # LoRA rank" in text
    assert "    learning_rate: 0.002   # paper: 1e-4" in text
    assert "seeds: [0]   # one seed" in text and "  # the recipe" in text
    params = load_params(path)
    assert (params.injection.lora.epochs, params.injection.lora.rank, params.injection.lora.alpha) == (12, 16, 16)
    assert params.injection.calibration.n_trials == 3 and params.tracking.experiment == "kbench"
    assert params.injection.calibration.epochs == (4, 16)
    with pytest.raises(ParamsError):
        cal.write_calibrated(path, {"epochs": "many", "learning_rate": 0.002, "rank": 16, "alpha": 16})
