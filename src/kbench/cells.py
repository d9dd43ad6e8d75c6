"""The `cell` stage: one (base model, substrate, recipe, method, seed) run end to end.

It samples n forget and n retain queries, builds the deployed agent, runs it (resumably),
scores the traces with the observer, and records the cell as an MLflow run whose
trajectories are MLflow traces. Layout and tags: docs/tracking.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from kbench import tracking
from kbench.config import Params
from kbench.corpus import load_corpus
from kbench.metrics import score_records
from kbench.records import TraceRecord

log = logging.getLogger(__name__)

CELLS_DIR = Path("artifacts/cells")
TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.json"
#: Fingerprint of everything that shapes a trajectory; traces made under another are stale.
INPUTS_FILE = "inputs.json"
RECIPES = ("none", "lora", "merged", "lora-d")


@dataclass(frozen=True)
class CellSpec:
    substrate: str
    method: str
    seed: int
    recipe: str = "none"

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown injection recipe {self.recipe!r}; expected one of {RECIPES}")
        if (self.substrate == "P") != (self.recipe in ("lora", "merged")):
            raise ValueError(
                f"recipe {self.recipe!r} does not fit substrate {self.substrate}: P takes lora or "
                "merged, the other substrates none or lora-d"
            )

    @property
    def cell_id(self) -> str:
        return f"{self.substrate}__{self.recipe}__{self.method}__s{self.seed}"

    @property
    def stage_dir(self) -> str:
        """The DVC matrix output (substrate x method x seed); recipes are folders inside it."""
        return f"{self.substrate}__{self.method}__s{self.seed}"

    def key(self, base_model: str) -> str:
        return f"{base_model}/{self.substrate}/{self.recipe}/{self.method}/{self.seed}"


SKIPPED_FILE = "skipped.json"


def unreachable_reason(substrate: str, method: str) -> str | None:
    """Why the method cannot act on the substrate (SPEC §11 routing), or None if it can."""
    from kbench.methods.base import method_class
    from kbench.substrates import substrate_class

    substrate_class(substrate)  # an unknown substrate is an error naming the known ones
    reachable = method_class(method).substrates
    if substrate in reachable:
        return None
    return f"method {method!r} cannot act on substrate {substrate} (it acts on {sorted(reachable)})"


def write_skipped(out_root: Path, spec: CellSpec, reason: str) -> Path:
    """The DVC output of a matrix entry whose method cannot reach its substrate."""
    stage_dir = out_root / spec.stage_dir
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    (stage_dir / SKIPPED_FILE).write_text(json.dumps({"reason": reason}) + "\n")
    return stage_dir


def base_model_name(params: Params) -> str:
    return Path(params.model.path).name


#: Params sections that do not shape a trajectory (the cell list, scoring, where runs go).
_NOT_SHAPING = {"seeds", "substrates", "methods", "scoring", "tracking", "corpus"}


def _inputs_fingerprint(params: Params, spec: CellSpec, corpus_fingerprint: str, extra: dict) -> dict:
    shaping = {
        "cell": spec.cell_id,
        "corpus": corpus_fingerprint,
        **params.model_dump(exclude=_NOT_SHAPING),
        **extra,
    }
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()
    return {"digest": digest[:20], **shaping}


def _prepare_output(out_dir: Path, inputs: dict) -> None:
    """Keep finished traces only if they were made from the same inputs (else start over)."""
    inputs_path = out_dir / INPUTS_FILE
    if out_dir.exists():
        previous = json.loads(inputs_path.read_text())["digest"] if inputs_path.exists() else None
        if previous != inputs["digest"]:
            if (out_dir / TRACES_FILE).exists():
                log.warning("%s: inputs changed since its traces were made; starting the cell over", out_dir)
            shutil.rmtree(out_dir)
        else:
            for stale in (METRICS_FILE, tracking.RUN_MANIFEST):
                (out_dir / stale).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs_path.write_text(json.dumps(inputs, indent=2, sort_keys=True, default=str) + "\n")


def score_cell(records: list[TraceRecord], params: Params, seed: int) -> dict[str, dict]:
    """The observer's metrics per split, as `kbench score --json` prints them."""
    return {
        split: score_records([r for r in records if r.split == split], params.scoring, seed).to_json()
        for split in ("forget", "retain")
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
    adapter_path: Path | None = None,
    out_root: Path = CELLS_DIR,
    track: bool = True,
) -> Path:
    """Run (or resume) one cell and record it; returns the cell's output folder."""
    from kbench.agent_base import agent_model_config
    from kbench.injection import cell_adapter, check_cell_adapter
    from kbench.runner import run_cell, setup_cell

    model = agent_model_config(params)
    if adapter_path is None and spec.recipe != "none":
        adapter_path = cell_adapter(params, spec.substrate, spec.recipe, spec.method)
    if adapter_path is not None:
        check_cell_adapter(spec.substrate, spec.recipe, spec.method, adapter_path, model.path)
    corpus = load_corpus(corpus_dir)
    out_dir = out_root / spec.stage_dir / spec.recipe
    adapter_digest = tracking.output_hash(adapter_path) if adapter_path else None
    inputs = _inputs_fingerprint(params, spec, corpus.fingerprint(), {"adapter": adapter_digest})
    _prepare_output(out_dir, inputs)

    fields = tuple(params.queries.fields)
    n = params.queries.n_per_split
    items = [(q, "forget") for q in corpus.sample_queries("forget", n, spec.seed, fields)]
    items += [(q, "retain") for q in corpus.sample_queries("retain", n, spec.seed, fields)]

    agent = setup_cell(
        params, corpus, model,
        substrate=spec.substrate, method=spec.method, seed=spec.seed,
        index_dir=index_dir, adapter_path=str(adapter_path) if adapter_path else None,
        merge_adapter=spec.recipe == "merged",
    )
    records = run_cell(agent, items, out_dir / TRACES_FILE)
    metrics = score_cell(records, params, spec.seed)
    tmp = out_dir / (METRICS_FILE + ".tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    tmp.replace(out_dir / METRICS_FILE)

    base_model = base_model_name(params)
    tags = {
        "kbench.base_model": base_model,
        "kbench.substrate": spec.substrate,
        "kbench.recipe": spec.recipe,
        "kbench.method": spec.method,
        "kbench.seed": str(spec.seed),
        "kbench.corpus": corpus.fingerprint(),
    }
    tracking.write_manifest(out_dir, "cell", spec.key(base_model), tags, flat_metrics(metrics))
    log.info(
        "cell %s: OR(all) forget %.3f retain %.3f, degeneration forget %.3f",
        spec.cell_id, metrics["forget"]["or_all"], metrics["retain"]["or_all"],
        metrics["forget"]["degeneration"],
    )
    if track:
        tracking.log_output(params, out_dir)
    return out_dir
