"""The `inject` stage (`kbench inject`): train LoRA-T+D, merge it, train LoRA-D and the retain-only gold.

Each folder is written atomically (built beside its final name, then renamed), checked with
`kbench.parametric.check_injected` and recorded as an MLflow run (docs/parametric.md).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from kbench import io, tracking
from kbench.cli.app import add_command
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.design import load_design
from kbench.parametric.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_DIRS,
    ADAPTER_KIND,
    DISTRACTOR,
    GOLD,
    INJECTION_FILE,
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

log = logging.getLogger(__name__)

COMMAND = "inject"


def _record(
    params: Params, folder: Path, name: str, metrics: dict[str, float], artifacts: list[str], track: bool
) -> None:
    tracking.record_output(
        params, folder, tracking.KIND_INJECT, f"{params.base_model}/{name}",
        tags={tracking.TAG_BASE_MODEL: params.base_model, tracking.TAG_INJECTION: name},
        metrics=metrics, artifacts=artifacts, track=track,
    )


def run_inject_stage(params: Params, corpus: Corpus, base_dir: Path, *, track: bool = True) -> dict[str, dict]:
    """Train LoRA-T+D, merge it, train LoRA-D and gold; write, check and record each folder."""
    out_root = Path(params.injection.out_dir)
    roles = training_entities(corpus, params)
    groups = probe_groups(corpus, params)
    fingerprint = base_fingerprint(base_dir)
    recipe = params.injection.model_dump(exclude={"calibration", "out_dir", "recall_batch_size"})
    results = {}
    for role in (TARGET, DISTRACTOR, GOLD):
        name = ADAPTER_DIRS[role]
        folder = out_root / name
        run, tokenizer = train_injection(params, corpus, base_dir, roles[role])
        info = {
            "kind": ADAPTER_KIND, "role": role, "entities": roles[role], "base_fingerprint": fingerprint,
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
                "n_entities": float(len(roles[role])),
                "first_loss": run.step_losses[0],
                "final_loss": run.step_losses[-1],
                **recall_metrics(merged_model, tokenizer, groups, params),
            }
            info["metrics"] = metrics
            io.write_json(partial / INJECTION_FILE, info)
            io.write_hashes(partial)
        check_injected(folder, base_dir, role=role)
        _record(params, folder, name, metrics, [INJECTION_FILE, ADAPTER_CONFIG], track)
        results[name] = metrics
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


def cmd_inject(args: argparse.Namespace) -> int:
    """Train LoRA-T+D, merge it, train LoRA-D and the retain-only gold (injection.*)."""
    params = load_design(args.params)
    results = run_inject_stage(
        params, load_corpus(args.corpus), Path(agent_model_config(params).path), track=not args.no_track,
    )
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    add_command(sub, COMMAND, cmd_inject, "train the P adapters: LoRA-T+D, merged, LoRA-D, gold (injection.*)",
                corpus=CORPUS_DIR)
