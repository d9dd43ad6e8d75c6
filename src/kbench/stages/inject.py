"""The `inject` stage (`kbench inject`): train LoRA-T+D, merge it, train LoRA-D and the retain-only gold.

Each folder is written atomically (built beside its final name, then renamed), checked with
`kbench.parametric.check_injected` and recorded as an MLflow run (docs/parametric.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from kbench import io, tracking
from kbench.cli.app import add_command
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.design import load_design, require_weights
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
from kbench.stages.corpus import CORPUS_DIR
from kbench.workers import run_queue, serve_queue

log = logging.getLogger(__name__)

COMMAND = "inject"

#: The trainings of the stage, in the order one process runs them.
ROLES = (TARGET, DISTRACTOR, GOLD)
#: Each training's role by its folder name, the name a queue child is handed.
ROLE_OF = {ADAPTER_DIRS[role]: role for role in ROLES}


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


def run_inject_stage(params: Params, corpus: Corpus, base_dir: Path, *, track: bool = True, workers: int = 1,
                     child_command: list[str] | None = None) -> dict[str, dict]:
    """Train LoRA-T+D, merge it, train LoRA-D and gold; write, check and record each folder.

    With `workers` > 1 and `child_command` (a `kbench inject --queue` command) the three
    trainings go through that many children from a work queue, the one with the most entities
    first (`kbench.workers.run_queue`); this process logs each folder to MLflow. The
    adapters do not depend on the thread count (tests/test_injection.py)."""
    Path(params.injection.out_dir).mkdir(parents=True, exist_ok=True)
    if workers <= 1 or child_command is None:
        results: dict[str, dict] = {}
        for role in ROLES:
            results.update(inject_one(params, corpus, base_dir, role, track=track))
        return results
    sizes = {role: len(entities) for role, entities in training_entities(corpus, params).items()}

    def logged(item: str, seconds: float) -> None:
        log.info("inject %s finished in %.0f s", item, seconds)
        if track:
            for name in _folders(ROLE_OF[item]):
                tracking.log_output(params, Path(params.injection.out_dir) / name)

    order = sorted(ROLES, key=lambda role: -sizes[role])  # stable: ties keep ROLES' order
    failed = run_queue(child_command, [ADAPTER_DIRS[role] for role in order], workers, logged)
    if failed:
        raise InjectionError(f"injection trainings failed: {', '.join(failed)} (their messages are above)")
    return {
        name: json.loads((Path(params.injection.out_dir) / name / INJECTION_FILE).read_text())["metrics"]
        for role in ROLES for name in _folders(role)
    }


def serve_inject_queue(params: Params, corpus: Corpus, base_dir: Path) -> None:
    """The `kbench inject --queue` child: train each adapter named on stdin ("lora_td",
    "lora_d", "gold"), in turn in this process (untracked: the parent logs)."""
    serve_queue(lambda name: inject_one(params, corpus, base_dir, ROLE_OF[name], track=False), widen=True)


def _child_command(args: argparse.Namespace) -> list[str]:
    """The `kbench inject --queue` child of a stage with inject_workers > 1."""
    return [sys.executable, "-m", "kbench.cli.main", "--params", args.params, "inject", "--queue",
            "--corpus", args.corpus, "--no-track"]


def cmd_inject(args: argparse.Namespace) -> int:
    """Train LoRA-T+D, merge it, train LoRA-D and the retain-only gold (injection.*)."""
    params = load_design(args.params)
    require_weights(params, COMMAND, "trains LoRA adapters on the model's weights")
    base_dir = Path(agent_model_config(params).path)
    if args.queue:  # a child of the stage: one adapter name per stdin line
        serve_inject_queue(params, load_corpus(args.corpus), base_dir)
        return 0
    results = run_inject_stage(
        params, load_corpus(args.corpus), base_dir, track=not args.no_track,
        workers=params.execution.inject_workers if args.workers is None else args.workers,
        child_command=_child_command(args),
    )
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, COMMAND, cmd_inject, "train the P adapters: LoRA-T+D, merged, LoRA-D, gold (injection.*)",
                    corpus=CORPUS_DIR)
    p.add_argument("--workers", type=int, default=None,
                   help="trainings side by side, from a work queue (default: execution.inject_workers)")
    # Read one adapter name per line on stdin and train it: the stage's children; hidden from --help.
    p.add_argument("--queue", action="store_true", help=argparse.SUPPRESS)
