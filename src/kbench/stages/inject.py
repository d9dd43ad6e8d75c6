"""The `inject` stage (`kbench inject`): train LoRA-T+D, merge it, train LoRA-D and the retain-only gold.

Each folder is written atomically (built beside its final name, then renamed), checked with
`kbench.parametric.check_injected` and recorded as an MLflow run (docs/parametric.md).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.design import require_weights
from kbench.parametric.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_DIRS,
    ADAPTER_KIND,
    DISTRACTOR,
    GOLD,
    INJECTION_FILE,
    InjectionError,
    MERGED_DIR,
    MERGED_KIND,
    TARGET,
    base_fingerprint,
    check_injected,
    settle_adapter_config,
)
from kbench.parametric.agent_base import agent_model_config
from kbench.parametric.injection import train_injection, training_entities
from kbench.parametric.recall import probe_groups, recall_metrics
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.workers import run_pool

log = logging.getLogger(__name__)

COMMAND = "inject"
HELP = "train the P adapters: LoRA-T+D, merged, LoRA-D, gold (injection.*)"

#: The trainings of the stage, in the order one process runs them.
ROLES = (TARGET, DISTRACTOR, GOLD)


def _record(
    params: Params, folder: Path, name: str, metrics: dict[str, float], artifacts: list[str], track: bool
) -> None:
    tracking.record_output(
        params, folder, tracking.KIND_INJECT, f"{params.base_model}/{name}",
        tags={tracking.TAG_BASE_MODEL: params.base_model, tracking.TAG_INJECTION: name},
        metrics=metrics, artifacts=artifacts, track=track,
    )


def inject_one(params: Params, corpus: Corpus, base_dir: Path, role: str, *, track: bool) -> dict[str, dict]:
    """Train one adapter (`role`), write it with its recall metrics, check and record it; for
    LoRA-T+D also its merge. Returns the metrics by folder name."""
    out_root = Path(params.injection.out_dir)
    entities = training_entities(corpus, params)[role]
    fingerprint = base_fingerprint(base_dir)
    recipe = params.injection.model_dump(exclude={"calibration", "out_dir", "recall_batch_size"})
    name = ADAPTER_DIRS[role]
    folder = out_root / name
    run, tokenizer = train_injection(params, corpus, base_dir, entities)
    info = {
        "kind": ADAPTER_KIND, "role": role, "entities": entities, "base_fingerprint": fingerprint,
        "base_model": str(base_dir), "recipe": recipe, "step_losses": run.step_losses,
        "epoch_losses": run.epoch_losses,
    }
    with io.atomic_dir(folder) as partial:
        run.model.save_pretrained(partial)
        settle_adapter_config(partial)
        # The probes read the adapter merged into the weights: the same function up to float
        # rounding, without the adapter's extra matrices at every decoding step; for
        # LoRA-T+D it is exactly the merged recipe's model.
        merged_model = run.model.merge_and_unload()
        metrics = {
            "n_entities": float(len(entities)),
            "first_loss": run.step_losses[0],
            "final_loss": run.step_losses[-1],
            **recall_metrics(merged_model, tokenizer, probe_groups(corpus, params), params),
        }
        info["metrics"] = metrics
        io.write_json(partial / INJECTION_FILE, info)
        io.write_hashes(partial)
    check_injected(folder, base_dir, role=role)
    _record(params, folder, name, metrics, [INJECTION_FILE, ADAPTER_CONFIG], track)
    results = {name: metrics}
    if role == TARGET:
        merged = out_root / MERGED_DIR
        with io.atomic_dir(merged) as partial:
            merged_model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            io.write_json(partial / INJECTION_FILE, {**info, "kind": MERGED_KIND, "source_adapter": name})
            io.write_hashes(partial)
        check_injected(merged, base_dir, role=role)
        _record(params, merged, MERGED_DIR, metrics, [INJECTION_FILE, "config.json"], track)
        results[MERGED_DIR] = metrics
    log.info("inject %s: %s", name, metrics)
    return results


def _folders(role: str) -> list[str]:
    """The folders one role's training writes: its adapter, and for LoRA-T+D its merge."""
    return [ADAPTER_DIRS[role], MERGED_DIR] if role == TARGET else [ADAPTER_DIRS[role]]


@dataclass(frozen=True)
class Training:
    """One adapter training of the stage, as a pool worker is handed it."""

    #: The design.
    params: Params
    #: The corpus the adapter learns from.
    corpus: Corpus
    #: The agent base the adapter is trained on.
    base_dir: Path
    #: Which adapter (`ROLES`).
    role: str


def train(job: Training) -> None:
    """A pool worker's task: one adapter, untracked (the stage's process logs it)."""
    inject_one(job.params, job.corpus, job.base_dir, job.role, track=False)


def run_inject_stage(params: Params, corpus: Corpus, base_dir: Path, *, track: bool = True,
                     workers: int = 1) -> dict[str, dict]:
    """Train LoRA-T+D, merge it, train LoRA-D and gold; write, check and record each folder.

    With `workers` > 1 the three trainings go through a pool of that many processes, the one
    with the most entities first (`kbench.workers.run_pool`); this process logs each folder to
    MLflow. The adapters do not depend on the thread count (tests/test_injection.py)."""
    Path(params.injection.out_dir).mkdir(parents=True, exist_ok=True)
    if workers <= 1:
        results: dict[str, dict] = {}
        for role in ROLES:
            results.update(inject_one(params, corpus, base_dir, role, track=track))
        return results
    sizes = {role: len(entities) for role, entities in training_entities(corpus, params).items()}

    def logged(job: Training, _: None, seconds: float) -> None:
        log.info("inject %s finished in %.0f s", ADAPTER_DIRS[job.role], seconds)
        if track:
            for name in _folders(job.role):
                tracking.log_output(params, Path(params.injection.out_dir) / name)

    order = sorted(ROLES, key=lambda role: -sizes[role])  # stable: ties keep ROLES' order
    failed = run_pool(train, [Training(params, corpus, base_dir, role) for role in order], workers, logged,
                      label=lambda job: ADAPTER_DIRS[job.role])
    if failed:
        raise InjectionError(f"injection trainings failed: {', '.join(failed)} (their messages are above)")
    return {
        name: json.loads((Path(params.injection.out_dir) / name / INJECTION_FILE).read_text())["metrics"]
        for role in ROLES for name in _folders(role)
    }


@dataclass(frozen=True)
class Options:
    """`kbench inject`'s options."""

    #: The corpus the adapters learn from.
    corpus: Path = corpus_option()
    #: Trainings side by side; None: `execution.inject_workers`.
    workers: int | None = option(None, "trainings side by side, in a process pool (default: execution.inject_workers)")
    #: Record each folder as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    """Train LoRA-T+D, merge it, train LoRA-D and the retain-only gold (injection.*)."""
    require_weights(params, COMMAND, "trains LoRA adapters on the model's weights")
    results = run_inject_stage(
        params, load_corpus(options.corpus), Path(agent_model_config(params).path), track=options.track,
        workers=params.execution.inject_workers if options.workers is None else options.workers,
    )
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0
