"""The `cell` stage (`kbench cell`): one (base model, substrate, recipe, method, seed) run end to end.

It samples n forget and n retain queries, builds the deployed agent, runs it (resumably),
scores the traces with the observer, and records the cell as an MLflow run whose
trajectories are MLflow traces. Layout and tags: docs/tracking.md.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kbench import io, tracking
from kbench.agent import run_cell, setup_cell
from kbench.config import ModelConfig, Params
from kbench.corpus import load_corpus
from kbench.design import design_digest, require_weights
from kbench.forms import ladder, refused_again
from kbench.methods import Fitted, method_class
from kbench.methods.fitting import fitted_dir, load_fitted
from kbench.names import (
    ADAPTER_FREE,
    BASELINE_METHOD,
    CONTROL,
    LORA,
    MERGED,
    P_RECIPES,
    PARAMETRIC,
    RECIPES,
)
from kbench.observer.metrics import score_traces
from kbench.parametric import agent_model_config, cell_adapter, check_cell_adapter, model_fingerprint
from kbench.methods.unlearning import CONTINUED, Unlearned
from kbench.parametric.unlearning import check_unlearned, unlearned_dir
from kbench.records import FORGET, RETAIN, SPLITS, TraceRecord
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.index import INDEX_DIR
from kbench.stages.inputs import shaping
from kbench.stages.unit import open_unit
from kbench.substrates import substrate_class
from kbench.workers import run_pool

log = logging.getLogger(__name__)

COMMAND = "cell"
HELP = "run one cell (substrate x recipe x method x seed) and score it"
TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class CellSpec:
    substrate: str
    method: str
    seed: int
    recipe: str = ADAPTER_FREE

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown injection recipe {self.recipe!r}; expected one of {RECIPES}")
        if (self.substrate == PARAMETRIC) != (self.recipe in P_RECIPES):
            raise ValueError(
                f"recipe {self.recipe!r} does not fit substrate {self.substrate}: {PARAMETRIC} takes "
                f"{' or '.join(P_RECIPES)}, the other substrates {ADAPTER_FREE} or {CONTROL}"
            )

    @property
    def cell_id(self) -> str:
        return f"{self.substrate}__{self.recipe}__{self.method}__s{self.seed}"

    @property
    def stage_dir(self) -> str:
        """The DVC matrix output (substrate x seed): one folder per method inside it, and one
        per recipe inside that."""
        return f"{self.substrate}__s{self.seed}"

    @property
    def method_dir(self) -> str:
        return f"{self.stage_dir}/{self.method}"

    def key(self, base_model: str) -> str:
        return f"{base_model}/{self.substrate}/{self.recipe}/{self.method}/{self.seed}"


SKIPPED_FILE = "skipped.json"


def cell_recipes(params: Params, substrate: str, recipe: str | None = None) -> list[str]:
    """The recipes a `kbench cell` call runs: the one asked for, else every `p_recipes` entry
    on P and the adapter-free recipe elsewhere."""
    if recipe is not None:
        return [recipe]
    return list(params.p_recipes) if substrate == PARAMETRIC else [ADAPTER_FREE]


def unreachable_reason(substrate: str, method: str) -> str | None:
    """Why the method cannot act on the substrate (routing: docs/definitions.md, "Methods"), or None if it can."""
    substrate_class(substrate)  # an unknown substrate is an error naming the known ones
    reachable = method_class(method).substrates
    if substrate in reachable:
        return None
    return f"method {method!r} cannot act on substrate {substrate} (it acts on {sorted(reachable)})"


def write_skipped(out_root: Path, spec: CellSpec, reason: str) -> Path:
    """The folder of a method that cannot reach the substrate: a skip marker saying why."""
    method_dir = out_root / spec.method_dir
    if method_dir.exists():
        shutil.rmtree(method_dir)
    method_dir.mkdir(parents=True)
    io.write_json(method_dir / SKIPPED_FILE, {"reason": reason})
    return method_dir


def _inputs_fingerprint(params: Params, spec: CellSpec, corpus_fingerprint: str, artifacts: dict) -> dict:
    """Everything that shapes the cell's trajectories: its key, the corpus, the params the cell
    stages declare as shaping (`kbench.stages.inputs`, the method's own section among them) and
    the hashes of the artifacts it loads."""
    inputs = {
        "cell": spec.cell_id,
        "corpus": corpus_fingerprint,
        **shaping(params, "cell", method=spec.method),
        **artifacts,
    }
    return {"digest": io.json_digest(inputs), **inputs}


def cell_tags(params: Params, spec: CellSpec, corpus_fingerprint: str, model: str) -> dict[str, str]:
    """The tags of a cell run (docs/tracking.md): its key's parts, and what makes it part of
    the design of `params` (`kbench.design.Design.excludes` reads them back)."""
    return {
        tracking.TAG_BASE_MODEL: params.base_model,
        tracking.TAG_SUBSTRATE: spec.substrate,
        tracking.TAG_RECIPE: spec.recipe,
        tracking.TAG_METHOD: spec.method,
        tracking.TAG_SEED: str(spec.seed),
        tracking.TAG_CORPUS: corpus_fingerprint,
        tracking.TAG_DESIGN: design_digest(params),
        tracking.TAG_N_PER_SPLIT: str(params.queries.n_per_split),
        tracking.TAG_MODEL: model,
    }


def score_cell(records: list[TraceRecord], params: Params, seed: int) -> dict[str, dict]:
    """The observer's metrics per split, as `kbench score --json` prints them, over the canonical
    questions (the ladder's forms are read by the comparison)."""
    return {
        split: score_traces([r for r in records if r.split == split and r.form is None], params.scoring,
                             seed).to_json()
        for split in SPLITS
    }


def flat_metrics(metrics: dict[str, dict]) -> dict[str, float]:
    """The headline numbers of metrics.json as MLflow metric names (forget.or_all, ...)."""
    flat: dict[str, float] = {}
    for split, scored in metrics.items():
        for name in ("or_all", "or_graded", "degeneration", "answer_severity"):
            if scored.get(name) is not None:
                flat[f"{split}.{name}"] = scored[name]
        for channel, value in (scored.get("cer") or {}).items():
            if value is not None:
                flat[f"{split}.cer.{channel}"] = value
        for budget, value in (scored.get("attacker_budget") or {}).items():
            if value is not None:
                flat[f"{split}.budget.{budget}"] = value
    return flat


def run_cell_stage(
    params: Params,
    spec: CellSpec,
    *,
    corpus_dir: Path,
    index_dir: Path | None,
    out_root: Path,
    adapter_path: Path | None = None,
    track: bool = True,
    progress: bool = True,
) -> Path:
    """Run (or resume) one cell and record it under `out_root`; returns the cell's output folder."""
    deployed = deployment(params, spec, adapter_path)
    model, adapter_path, unlearned, fitted = deployed.model, deployed.adapter_path, deployed.unlearned, deployed.fitted
    method = method_class(spec.method)
    corpus = load_corpus(corpus_dir)
    out_dir = out_root / spec.method_dir / spec.recipe
    adapter_digest = io.folder_hash(adapter_path) if adapter_path else None
    unlearned_digest = io.folder_hash(unlearned.path) if unlearned else None
    fitted_digest = deployed.fitted_digest
    corpus_fingerprint = corpus.fingerprint()
    inputs = _inputs_fingerprint(params, spec, corpus_fingerprint, {
        "adapter": adapter_digest,
        # the method's own fitted or trained artifact shapes its trajectories; no other method's does
        **({"fitted": fitted_digest} if fitted_digest else {}),
        **({"unlearned": unlearned_digest} if unlearned_digest else {}),
    })
    fields = tuple(params.queries.fields)
    n = params.queries.n_per_split
    items = [(q, split) for split in SPLITS for q in corpus.sample_queries(split, n, spec.seed, fields)]
    open_unit(out_dir, inputs, what="its cell", stale=(METRICS_FILE, tracking.RUN_MANIFEST))

    agent = setup_cell(
        params, corpus, model,
        substrate=spec.substrate, method=spec.method, seed=spec.seed,
        index_dir=index_dir, adapter_path=str(adapter_path) if adapter_path else None,
        merge_adapter=spec.recipe == MERGED, fitted=fitted, unlearned=unlearned,
    )
    # The ladder's questions queue behind the canonical ones and share their batches (a record
    # does not depend on its batch); the adaptive form asks again what the canonical one refused.
    forms, form_n = params.queries.forms, params.queries.form_n
    forget = [q for q, split in items if split == FORGET]
    asked = [(q, FORGET) for q in ladder(forget, corpus.entities, forms, form_n)]
    records = run_cell(agent, items + asked, out_dir / TRACES_FILE, progress=progress)
    again = [(q, FORGET) for q in refused_again(forget, records, corpus.entities, forms, form_n)]
    if again:
        records = run_cell(agent, items + asked + again, out_dir / TRACES_FILE, progress=progress)
    metrics = score_cell(records, params, spec.seed)
    io.write_json(out_dir / METRICS_FILE, metrics)

    tags = cell_tags(params, spec, corpus_fingerprint, model_fingerprint(model))
    if unlearned is not None:  # the unlearn run whose weights (and training curves) this cell deployed
        tags[tracking.TAG_UNLEARN_KEY] = f"{params.base_model}/{unlearned.method}/{unlearned.recipe}"
        tags[tracking.TAG_UNLEARNED_HASH] = unlearned_digest
        tags[tracking.TAG_BUDGET_EXCEPTIONS] = json.dumps(unlearned.info.get("budget_exceptions", {}), sort_keys=True)
    log.info(
        "cell %s: OR(all) forget %.3f retain %.3f, degeneration forget %.3f",
        spec.cell_id, metrics[FORGET]["or_all"], metrics[RETAIN]["or_all"], metrics[FORGET]["degeneration"],
    )
    tracking.record_output(
        params, out_dir, tracking.KIND_CELL, spec.key(params.base_model), tags=tags,
        metrics=flat_metrics(metrics), track=track,
    )
    return out_dir


@dataclass(frozen=True)
class Deployment:
    """What a cell deploys besides the substrate: checked before anything runs."""

    #: The agent's model section (the merged agent base when that stage is on).
    model: ModelConfig
    #: The adapter loaded on it (P's, an unlearned continuation of it, or LoRA-D); None: adapter-free.
    adapter_path: Path | None
    #: A weight method's checked `unlearn` output.
    unlearned: Unlearned | None
    #: A fitting method's `fit` output, and its folder's hash.
    fitted: Fitted | None
    fitted_digest: str | None


def deployment(params: Params, spec: CellSpec, adapter_path: Path | None = None) -> Deployment:
    """The model, adapter and method artifacts of `spec`'s cell, each checked (`setup_cell` takes them)."""
    model = agent_model_config(params)
    adapter_path, unlearned = _deployed_adapter(params, spec, model, adapter_path)
    method = method_class(spec.method)
    fitted, fitted_digest = None, None
    if method.fits:
        fitted = load_fitted(params, spec.method, model_fingerprint(model))
        fitted_digest = io.folder_hash(fitted_dir(params, spec.method))
    return Deployment(model, adapter_path, unlearned, fitted, fitted_digest)


def _deployed_adapter(params: Params, spec: CellSpec, model: ModelConfig,
                      adapter_path: Path | None = None) -> tuple[Path | None, Unlearned | None]:
    """The adapter `spec`'s cell loads (None: adapter-free) and a weight method's unlearned
    output, each checked against the agent's `model`."""
    if adapter_path is None and spec.recipe != ADAPTER_FREE:
        adapter_path = cell_adapter(params, spec.substrate, spec.recipe, spec.method)
    unlearned = None
    if method_class(spec.method).trains:
        unlearned = _unlearned(params, spec, adapter_path, model.path)
        if unlearned.kind == CONTINUED:  # it replaces LoRA-T+D
            adapter_path = unlearned.path
    if adapter_path is not None:
        check_cell_adapter(spec.substrate, spec.recipe, spec.method, adapter_path, model.path)
    return adapter_path, unlearned


def served_adapters(params: Params) -> dict[Path, list[str]]:
    """The adapter folders the design's cells deploy on a server that applies adapters by name
    (P's recipe lora with the methods such a server runs, and the LoRA-D control), each checked
    as its cell checks it (no fitted artifact is read): {folder: the cells (substrate/recipe/method)
    that ask for it}. Every seed deploys the same adapters."""
    seed = params.seeds[0]
    specs = [CellSpec(PARAMETRIC, name, seed, LORA) for name in params.methods
             if LORA in params.p_recipes and PARAMETRIC in method_class(name).substrates
             and method_class(name).runs_without_weights(serves_adapters=True)]
    specs += [CellSpec(substrate, BASELINE_METHOD, seed, CONTROL) for substrate in params.substrates]
    model = agent_model_config(params)
    folders: dict[Path, list[str]] = {}
    for spec in specs:
        folder, _ = _deployed_adapter(params, spec, model)
        folders.setdefault(folder, []).append(f"{spec.substrate}/{spec.recipe}/{spec.method}")
    return folders


def _unlearned(params: Params, spec: CellSpec, target: Path | None, base_dir: str) -> Unlearned:
    """The checked `unlearn` output a weight method's cell deploys (trained from `target`)."""
    if target is None:
        raise ValueError(f"method {spec.method!r} trains P's weights; its cell needs the P target adapter")
    trained_as = method_class(spec.method).trained_as()
    return check_unlearned(
        unlearned_dir(params.unlearning.out_dir, trained_as, spec.recipe), base_dir,
        method=trained_as, recipe=spec.recipe, source_hash=io.folder_hash(target),
    )


@dataclass(frozen=True)
class Options:
    """`kbench cell`'s options."""

    #: The substrate of the cell (required unless `controls`).
    substrate: str | None = option(None, "a registered substrate (P, C, R-text, R-struct)")
    #: The methods to run one after the other; empty: the baseline.
    method: tuple[str, ...] = option(
        (), f"unlearning method (default: {BASELINE_METHOD}); repeat it to run several, one after the other")
    #: The seed of the cell's query sample (required unless `controls`).
    seed: int | None = option(None, "the seed of the cell's query sample")
    #: The injection recipe; None: every `p_recipes` entry on P, the adapter-free recipe elsewhere.
    recipe: str | None = option(
        None, f"off {PARAMETRIC}: {ADAPTER_FREE} (default) or {CONTROL} (the control); {PARAMETRIC}: "
        f"{' or '.join(P_RECIPES)} (default: every one in p_recipes)", choices=RECIPES)
    #: Every method of the design on the substrate, in a process pool.
    all_methods: bool = option(
        False, "run every method of the design (`methods`) on the substrate, execution.cell_workers cells side by "
        "side; a method that cannot act on it leaves a skip marker (the DVC stages use this)")
    #: A method that cannot act on the substrate writes a skip marker instead of failing.
    skip_unreachable: bool = option(
        False, "a method that cannot act on the substrate writes a skip marker instead of failing")
    #: Show a progress bar.
    progress: bool = option(True, "no progress bar")
    #: The LoRA-D control on every adapter-free substrate and seed.
    controls: bool = option(
        False, "the LoRA-D control on every adapter-free substrate and seed, execution.cell_workers side by side "
        "(the DVC stage `controls` uses this)")
    #: The adapter loaded instead of the recipe's own.
    adapter: Path | None = option(None, "LoRA adapter folder for P or the LoRA-D control")
    #: The corpus the queries come from.
    corpus: Path = corpus_option()
    #: R-text's index.
    index: Path = option(INDEX_DIR, "R-text index folder")
    #: Where the cell folders are written (None: `cells.out_dir`, with --controls `cells.controls_dir`).
    out_root: Path | None = option(None, "cells folder (default: the params' cells.out_dir, with --controls "
                                   "cells.controls_dir)")
    #: Record each cell as an MLflow run.
    track: bool = track_option()


@dataclass(frozen=True)
class QueuedCell:
    """One cell of an --all-methods or --controls run, as a pool worker is handed it."""

    #: The design.
    params: Params
    #: The run's options (the worker's copy runs untracked, without a progress bar).
    options: Options
    #: The cell's substrate.
    substrate: str
    #: The cell's seed.
    seed: int
    #: The cell's method.
    method: str

    @property
    def label(self) -> str:
        return f"{self.substrate}/{self.seed}/{self.method}"


def run_queued(job: QueuedCell) -> None:
    """A pool worker's task: one method's cells on one substrate and seed, untracked (the stage's
    process logs them); a cell's traces do not depend on the cells run before it in the worker."""
    options = replace(job.options, substrate=job.substrate, seed=job.seed, track=False, progress=False)
    run_methods(job.params, options, [job.method])


def _queued(params: Params, options: Options, jobs: list[QueuedCell]) -> list[str]:
    """Run cells through a pool of `execution.cell_workers` processes; log each finished cell's runs."""
    def logged(job: QueuedCell, _: None, seconds: float) -> None:
        log.info("cell %s finished in %.0f s", job.label, seconds)
        if options.track:
            spec = CellSpec(job.substrate, job.method, job.seed, cell_recipes(params, job.substrate, options.recipe)[0])
            for recipe_dir in sorted((options.out_root / spec.method_dir).iterdir()):
                if (recipe_dir / tracking.RUN_MANIFEST).exists():
                    tracking.log_output(params, recipe_dir)

    return run_pool(run_queued, jobs, params.execution.cell_workers, logged, label=lambda job: job.label)


def run_all_methods(params: Params, options: Options) -> None:
    """Every method of the design on one substrate and seed through a pool of
    `execution.cell_workers` processes, each on its share of the cores, taking the next method
    when it finishes one (a cell's traces do not depend on its thread count or on the cells run
    before it in the process: tests/test_methods.py); each finished cell is then logged to
    MLflow by this process alone."""
    recipe = cell_recipes(params, options.substrate, options.recipe)[0]
    todo = []
    for method in params.methods:
        reason = unreachable_reason(options.substrate, method)
        if reason is None:
            todo.append(method)
        else:
            spec = CellSpec(options.substrate, method, options.seed, recipe)
            write_skipped(options.out_root, spec, reason)
            log.info("%s: %s (skip marker written)", options.out_root / spec.method_dir, reason)
    log.info("cells of %s seed %d: %s", options.substrate, options.seed, ", ".join(todo))
    failed = _queued(params, options, [QueuedCell(params, options, options.substrate, options.seed, m) for m in todo])
    if failed:
        raise CellError(f"cells of {options.substrate} seed {options.seed} failed: {', '.join(failed)} (their "
                        "messages are above; finished cells are kept and a rerun resumes)")


def run_controls(params: Params, options: Options) -> None:
    """The LoRA-D control (the `none` method with the distractor adapter) on every adapter-free
    substrate and seed of the design, through the same pool as --all-methods."""
    jobs = [QueuedCell(params, options, substrate, seed, BASELINE_METHOD)
            for substrate in params.substrates for seed in params.seeds]
    log.info("LoRA-D controls: %s", ", ".join(f"{job.substrate}/{job.seed}" for job in jobs))
    failed = _queued(params, options, jobs)
    if failed:
        raise CellError(f"LoRA-D controls failed: {', '.join(failed)} (their messages are above; finished cells "
                        "are kept and a rerun resumes)")


class CellError(ValueError):
    """A cell of an --all-methods run failed (its own message says why)."""


def main(params: Params, options: Options) -> int:
    """One cell (or, on P without --recipe, one per `p_recipes`): run, score, record; with
    --all-methods, every method of the design on the substrate; with --controls, the LoRA-D
    control on every adapter-free substrate and seed."""
    if options.out_root is None:
        folder = params.cells.controls_dir if options.controls else params.cells.out_dir
        options = replace(options, out_root=Path(folder))
    if options.controls:
        require_weights(params, "LoRA-D control", "loads the distractor adapter into the model's weights", served=True)
        run_controls(params, replace(options, recipe=CONTROL))
        return 0
    if options.substrate is None or options.seed is None:
        raise ValueError("kbench cell needs --substrate and --seed (or --controls)")
    if options.substrate == PARAMETRIC:
        require_weights(params, f"{PARAMETRIC} cell", "loads the injected adapters into the model's weights",
                        served=True)
        if not cell_recipes(params, options.substrate, options.recipe):
            # p_recipes: [] keeps P out of the design; DVC's cell_p stage still needs its folder
            (options.out_root / f"{PARAMETRIC}__s{options.seed}").mkdir(parents=True, exist_ok=True)
            log.info("p_recipes is empty: no %s cells (seed %d)", PARAMETRIC, options.seed)
            return 0
    if options.all_methods:
        run_all_methods(params, options)
        return 0
    run_methods(params, options, options.method or (BASELINE_METHOD,))
    return 0


def run_methods(params: Params, options: Options, methods: Sequence[str]) -> None:
    """The cells of `methods` on one substrate and seed, one after the other in this process."""
    for method in methods:
        specs = [CellSpec(options.substrate, method, options.seed, recipe)
                 for recipe in cell_recipes(params, options.substrate, options.recipe)]
        reason = unreachable_reason(options.substrate, method)
        if reason is not None:
            if not options.skip_unreachable:
                raise ValueError(reason)
            write_skipped(options.out_root, specs[0], reason)
            print(f"skipped: {reason}")
            continue
        for spec in specs:
            out = run_cell_stage(
                params, spec, corpus_dir=options.corpus, index_dir=options.index, adapter_path=options.adapter,
                out_root=options.out_root, track=options.track, progress=options.progress,
            )
            print(f"cell {spec.cell_id}: {out}")
