"""The `probes` stage (`kbench probes`): the direct-elicitation probes
(docs/definitions.md, "Direct-elicitation probes") on every model
the design deploys, read alone: no agent, no system-prompt bios, no tools (docs/probes.md).

Models: the agent base (what C, R-text and R-struct deploy), the LoRA-D control, and on P for
each recipe of the design the no-intervention target, the gold reference and every method
whose change acts without the agent: weight methods (their unlearned weights), forward-hook
methods (activation edits, ECO, O3's gate). The P target is probed in both recipes. A method
that acts only on the agent's output (StaR) has nothing to act on here: it is listed as not
applicable. Each model gets `probes.out_dir/<model>/` (raw.json, scores.json, inputs.json),
written atomically, and an MLflow run of kind `probe` with its raw rows; `summary.json` reads
every model against the gold reference of its recipe. A rerun keeps finished models.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch

from kbench import io, tracking
from kbench.agent import deployed_model
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.design import require_weights
from kbench.methods import method_class
from kbench.names import (
    ADAPTER_FREE,
    BASELINE_METHOD,
    CONTEXT,
    CONTROL,
    GOLD_METHOD,
    LORA,
    MERGED,
    PARAMETRIC,
    PROBED_AGENT_BASE,
    PROBED_CONTROL,
    PROBES_SUMMARY_FILE,
    probed_p_key,
)
from kbench.parametric import model_fingerprint
from kbench.probes.items import ProbeItems, probe_items
from kbench.probes.run import ProbeRunner, run_probes
from kbench.probes.summary import clean_verdicts, scores
from kbench.stages.cell import CellSpec, Deployment, deployment
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.inputs import shaping
from kbench.workers import run_pool

log = logging.getLogger(__name__)

COMMAND = "probes"
HELP = "run the direct-elicitation probes on every model of the design"
RAW_FILE, SCORES_FILE, INPUTS_FILE = "raw.json", "scores.json", "inputs.json"


@dataclass(frozen=True)
class ProbedModel:
    """One model the probes read."""

    #: Its folder under `probes.out_dir` and its name in the tables.
    key: str
    #: The cell whose deployed model it is (the adapter-free agent base is C's baseline).
    spec: CellSpec
    #: Why it is not probed (a method acting on the agent's output only); None: it is.
    not_applicable: str | None = None


def probed_models(params: Params) -> list[ProbedModel]:
    """Every model of the design, in table order."""
    seed = params.seeds[0]
    models = [
        ProbedModel(PROBED_AGENT_BASE, CellSpec(CONTEXT, BASELINE_METHOD, seed, ADAPTER_FREE)),
        ProbedModel(PROBED_CONTROL, CellSpec(CONTEXT, BASELINE_METHOD, seed, CONTROL)),
    ]
    recipes = list(dict.fromkeys([*params.p_recipes, LORA, MERGED]))
    for recipe in recipes:
        methods = [BASELINE_METHOD]
        if recipe in params.p_recipes:
            methods += [m for m in params.methods if m != BASELINE_METHOD and PARAMETRIC in method_class(m).substrates]
        for method in methods:
            hooks = method_class(method).hooks
            reason = None
            if hooks and not hooks & {"weights", "forward", "input"}:
                reason = f"{method} acts on the agent's output only ({', '.join(sorted(hooks))} hook)"
            models.append(ProbedModel(probed_p_key(recipe, method), CellSpec(PARAMETRIC, method, seed, recipe), reason))
    return models


def _inputs(params: Params, model: ProbedModel, corpus: Corpus, deployed: Deployment) -> dict[str, Any]:
    """Everything that shapes a model's raw rows (the clean thresholds only read them)."""
    inputs = {
        "model": model.key,
        "corpus": corpus.fingerprint(),
        "base": model_fingerprint(deployed.model),
        **shaping(params, "probes", method=model.spec.method),  # the stage's declared inputs
        "adapter": io.folder_hash(deployed.adapter_path) if deployed.adapter_path else None,
        "unlearned": io.folder_hash(deployed.unlearned.path) if deployed.unlearned else None,
        "fitted": deployed.fitted_digest,
    }
    return {"digest": io.json_digest(inputs), **inputs}


def _finished(folder: Path, digest: str) -> bool:
    try:
        return json.loads((folder / INPUTS_FILE).read_text(encoding="utf-8"))["digest"] == digest and (
            folder / SCORES_FILE).exists()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def probe_model(params: Params, corpus: Corpus, model: ProbedModel, items: ProbeItems, out_root: Path, *,
                track: bool) -> Path:
    """Probe one model (or keep its finished folder); returns the folder."""
    folder = out_root / model.key
    deployed = deployment(params, model.spec)
    inputs = _inputs(params, model, corpus, deployed)
    if _finished(folder, inputs["digest"]):
        log.info("probes %s: finished earlier (kept)", model.key)
        return folder
    started = time.perf_counter()
    backend, method = deployed_model(
        params, corpus, deployed.model, substrate=model.spec.substrate, method=model.spec.method,
        seed=model.spec.seed, adapter_path=str(deployed.adapter_path) if deployed.adapter_path else None,
        merge_adapter=model.spec.recipe == MERGED, fitted=deployed.fitted, unlearned=deployed.unlearned,
    )
    raw = run_probes(ProbeRunner(backend, method, params.probes), items)
    own = scores(raw, params.probes)
    with io.atomic_dir(folder) as partial:
        io.write_json(partial / RAW_FILE, raw)
        io.write_json(partial / SCORES_FILE, own)
        io.write_json(partial / INPUTS_FILE, inputs, default=str)
    log.info("probes %s in %.0f s: %s", model.key, time.perf_counter() - started,
             {k: round(v, 3) for k, v in own.items() if isinstance(v, float)})
    tags = {
        tracking.TAG_BASE_MODEL: params.base_model, tracking.TAG_SUBSTRATE: model.spec.substrate,
        tracking.TAG_RECIPE: model.spec.recipe, tracking.TAG_METHOD: model.spec.method,
    }
    tracking.record_output(
        params, folder, tracking.KIND_PROBE, f"{params.base_model}/probes/{model.key}", tags=tags,
        metrics={k: v for k, v in own.items() if isinstance(v, float)}, artifacts=[RAW_FILE, SCORES_FILE], track=track,
    )
    return folder


def gold_key(recipe: str) -> str:
    """The gold reference a model is read against: its recipe's (LoRA's off P)."""
    return probed_p_key(recipe if recipe in (LORA, MERGED) else LORA, GOLD_METHOD)


def summarize(params: Params, models: list[ProbedModel], out_root: Path) -> dict[str, Any]:
    """Each model's scores against its gold reference, and each probe's clean verdict."""
    raws = {m.key: json.loads((out_root / m.key / RAW_FILE).read_text(encoding="utf-8"))
            for m in models if m.not_applicable is None}
    references = {key: scores(raws[key], params.probes, gold=raws[key])
                  for key in (gold_key(LORA), gold_key(MERGED)) if key in raws}
    summary: dict[str, Any] = {}
    for m in models:
        entry: dict[str, Any] = {"substrate": m.spec.substrate, "recipe": m.spec.recipe, "method": m.spec.method}
        if m.not_applicable is not None:
            summary[m.key] = {**entry, "not_applicable": m.not_applicable}
            continue
        reference = gold_key(m.spec.recipe) if gold_key(m.spec.recipe) in raws else gold_key(LORA)
        own = scores(raws[m.key], params.probes, gold=raws.get(reference))
        summary[m.key] = {**entry, "scores": own,
                          "clean": clean_verdicts(own, references.get(reference), params.probes.clean)}
    return summary


@dataclass(frozen=True)
class ProbeJob:
    """One model to probe, as a pool worker is handed it."""

    #: The design.
    params: Params
    #: The corpus the probe items come from.
    corpus: Corpus
    #: The model.
    model: ProbedModel
    #: The probe items (the same for every model).
    items: ProbeItems


def probe(job: ProbeJob) -> None:
    """A pool worker's task: probe one model, untracked (the stage's process logs it)."""
    probe_model(job.params, job.corpus, job.model, job.items, Path(job.params.probes.out_dir), track=False)


def run_probes_stage(params: Params, corpus: Corpus, *, track: bool = True, only: Sequence[str] = (),
                     workers: int = 1) -> dict[str, Any]:
    """Probe every model of the design (or `only` those keys), keeping finished ones, then
    write summary.json. With `workers` > 1 the models go through a pool of that many processes
    (`kbench.workers.run_pool`); this process logs each to MLflow. Alone or pooled, a model is
    probed on one thread, so its scores are the same bytes."""
    out_root = Path(params.probes.out_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    models = probed_models(params)
    if only:
        unknown = sorted(set(only) - {m.key for m in models})
        if unknown:
            raise ValueError(f"unknown probed model(s) {unknown}; the design probes {[m.key for m in models]}")
        models = [m for m in models if m.key in only]
    items = probe_items(corpus, params)
    log.info("probes: %d models, %d questions, %d bios, %d general facts", len(models), len(items.questions),
             len(items.bios), len(items.general))
    for model in models:
        if model.not_applicable is not None:
            log.info("probes %s: not applicable (%s)", model.key, model.not_applicable)
    todo = [m for m in models if m.not_applicable is None]
    if workers > 1 and len(todo) > 1:
        def logged(job: ProbeJob, _: None, seconds: float) -> None:
            log.info("probes %s finished in %.0f s", job.model.key, seconds)
            if track:
                tracking.log_output(params, out_root / job.model.key)

        failed = run_pool(probe, [ProbeJob(params, corpus, model, items) for model in todo], workers, logged,
                          label=lambda job: job.model.key, threads=1)
        if failed:
            raise ProbesError(f"probes failed: {', '.join(failed)} (their messages are above; finished models are "
                              "kept and a rerun resumes)")
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as a pool worker runs: the same bytes whatever probe_workers is
        try:
            for i, model in enumerate(todo, start=1):
                log.info("probes [%d/%d] %s", i, len(todo), model.key)
                probe_model(params, corpus, model, items, out_root, track=track)
        finally:
            torch.set_num_threads(threads)
    summary = summarize(params, models, out_root)
    io.write_json(out_root / PROBES_SUMMARY_FILE, summary)
    return summary


class ProbesError(ValueError):
    """A probed model failed (its own message says why)."""


@dataclass(frozen=True)
class Options:
    """`kbench probes`'s options."""

    #: The corpus the probe items come from.
    corpus: Path = corpus_option()
    #: Only these model keys; empty: every model of the design.
    model: tuple[str, ...] = option((), "probe only this model key (repeatable; summary.json lists them)")
    #: Record each model as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    """Probe every model of the design; print each one's clean verdicts."""
    require_weights(params, COMMAND, "reads token probabilities and loads adapters into the model's weights")
    summary = run_probes_stage(params, load_corpus(options.corpus), track=options.track, only=options.model,
                               workers=params.execution.probe_workers)
    for key, entry in summary.items():
        verdicts = entry.get("clean") or {}
        shown = ", ".join(f"{p} {'clean' if v else 'flags' if v is not None else '-'}" for p, v in verdicts.items())
        print(f"{key}: {entry.get('not_applicable') or shown}")
    return 0
