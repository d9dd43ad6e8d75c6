"""The `fit` stage (`kbench fit`): every method of the design that learns something learns it
here, once per base model, from the adapter pools only (docs/definitions.md, "Corpus and splits"; docs/methods.md).

Each fitted method gets a folder under `fit.out_dir` (fitted.safetensors, diagnostics.json,
fit.json, hashes.json), written atomically, and an MLflow run with its diagnostics. Cells
load it (`kbench.methods.fitting.load_fitted`) and refuse one fitted for another base model.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.backends.hf import load_model
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.names import HF_BACKEND
from kbench.methods import MethodContext, MethodError, build_method
from kbench.agent.prompts import react_conversation
from kbench.methods.activation import ActivationEdit
from kbench.methods.fitting import (
    DIAGNOSTICS_FILE,
    FIT_INFO_FILE,
    FIT_POOLS,
    FitData,
    FitPrompt,
    fitted_dir,
    layer_scan,
    save_fitted,
)
from kbench.parametric import agent_model_config, model_fingerprint
from kbench.stages import track_option
from kbench.stages.corpus import corpus_option

log = logging.getLogger(__name__)

COMMAND = "fit"
HELP = "fit the methods that learn from the adapter pools (method_params.*)"
#: The held-out probe accuracy of forget-vs-retain at every layer (beside the method folders).
LAYER_SCAN_FILE = "layer_scan.json"


def fit_prompts(corpus: Corpus, params: Params) -> list[FitPrompt]:
    """Every (adapter-pool entity, field) prompt, forget pool first, in pool order."""
    prompts = []
    for pool, label in FIT_POOLS.items():
        for entity_id in corpus.pools[pool]:
            for query in corpus.queries_for(entity_id, tuple(params.queries.fields)):
                prompts.append(FitPrompt(
                    entity_id, query.field, label, query.question,
                    react_conversation(query.question, [], params.agent.max_iters),
                ))
    return prompts


def _numeric(diagnostics: dict, prefix: str = "") -> dict[str, float]:
    """The diagnostics' finite numbers, flattened to MLflow metric names (a.b.c)."""
    flat: dict[str, float] = {}
    for key, value in diagnostics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_numeric(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


def run_fit_stage(params: Params, corpus: Corpus, *, track: bool = True) -> dict[str, dict]:
    """Fit every method in `params.methods` that fits; returns each one's diagnostics."""
    methods = [build_method(name, MethodContext(corpus, params, seed=0)) for name in params.methods]
    fitting = [m for m in methods if m.fits]
    out_root = Path(params.fit.out_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    if not fitting:
        log.info("fit: no method of the design fits anything")
        return {}
    model_config = agent_model_config(params)
    for method in fitting:
        if method.needs_weights and model_config.backend != HF_BACKEND:
            raise MethodError(f"method {method.name!r} fits on model weights; the {model_config.backend} backend "
                              "has none (use model.backend: hf)")
    fingerprint = model_fingerprint(model_config)
    prompts = fit_prompts(corpus, params)
    data = FitData(lambda: load_model(model_config), corpus, params, prompts)
    pools = {pool: list(corpus.pools[pool]) for pool in FIT_POOLS}
    results = {}
    if any(isinstance(m, ActivationEdit) for m in fitting):  # where the concept is linearly readable
        scan = layer_scan(data)
        io.write_json(out_root / LAYER_SCAN_FILE, {"heldout_probe_accuracy": scan, "heldout_field": data.heldout_field()})
        log.info("fit: held-out probe accuracy by layer %s", {k: round(v, 3) for k, v in scan.items()})
    for method in fitting:
        started = time.perf_counter()
        fitted = method.fit(data)
        seconds = time.perf_counter() - started
        folder = fitted_dir(params, method.name)
        info = {
            "method": method.name, "config": method.config.model_dump(mode="json"),
            "base_model": str(model_config.path), "base_fingerprint": fingerprint,
            "pools": pools, "n_prompts": len(prompts),
        }  # no timing here: the same params give the same bytes (the time is an MLflow metric)
        save_fitted(folder, fitted, info)
        tracking.record_output(
            params, folder, tracking.KIND_FIT, f"{params.base_model}/{method.name}",
            tags={tracking.TAG_BASE_MODEL: params.base_model, tracking.TAG_METHOD: method.name},
            metrics=_numeric(fitted.diagnostics),  # deterministic: the time is in the log, not the manifest
            artifacts=[DIAGNOSTICS_FILE, FIT_INFO_FILE], track=track,
        )
        log.info("fit %s in %.1f s: %s", method.name, seconds, json.dumps(fitted.diagnostics, sort_keys=True)[:400])
        results[method.name] = fitted.diagnostics
    return results


@dataclass(frozen=True)
class Options:
    """`kbench fit`'s options."""

    #: The corpus whose adapter pools the methods learn from.
    corpus: Path = corpus_option()
    #: Record each fitted method as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    """Fit every method of the design that learns something (directions, erasers, probes, gates)."""
    results = run_fit_stage(params, load_corpus(options.corpus), track=options.track)
    print(json.dumps(results, indent=2, sort_keys=True, default=str))
    return 0
