"""Every stage's params inputs, declared once (`STAGE_INPUTS`).

Two layers decide what reruns, and both follow from this table: DVC reruns a stage when one of
its `params` changes (dvc.yaml lists exactly them: tests/test_stage_inputs.py fails otherwise),
and a stage that resumes item by item (cell, probes, unlearn) keeps a finished item only if
its resume digest is unchanged, a digest of the item's `shaping` keys (`shaping`) plus the
hashes of the artifacts it loads. A key that DVC watches but that does not shape a finished
item (the item list, a path, values recomputed on every run) is named in `not_shaping`; so a
change to it reruns the stage and keeps every finished item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kbench.config import Params
from kbench.design import DESIGN_SECTIONS
from kbench.methods import method_class, method_config

#: The params key of the methods' own sections: an item of one method takes only its own.
METHOD_PARAMS = "method_params"


@dataclass(frozen=True)
class StageInputs:
    """The params inputs of one DVC stage."""

    #: Params keys (sections or dotted keys) the stage reads: dvc.yaml's `params:` of the stage.
    params: tuple[str, ...] = ()
    #: Keys among (or under) `params` that shape no finished item: which items exist, where
    #: outputs go, values recomputed on every run, or what an artifact hash already covers.
    not_shaping: tuple[str, ...] = ()

    def shaping_keys(self) -> tuple[str, ...]:
        """The `params` keys an item's resume digest takes (sub-keys in `not_shaping` are cut later)."""
        return tuple(key for key in self.params if key not in self.not_shaping)


#: The cells' inputs: the sections of the design digest (a cell run's tag), the scoring (its
#: metrics are recomputed on every run), the method list and each method's own section.
_CELL = (*DESIGN_SECTIONS, "scoring", "methods", METHOD_PARAMS, "fit")
#: Cell keys that shape no trajectory: the corpus and the fitted artifacts enter the digest by
#: their content hashes, the scoring only rescored metrics, the method list only which cells run.
_CELL_NOT_SHAPING = ("corpus", "scoring", "methods", "fit")
#: The query-form ladder: asked of deployed agents in the cells only; no training or probe reads it.
_LADDER = ("queries.forms", "queries.form_n")

STAGE_INPUTS: dict[str, StageInputs] = {
    "corpus": StageInputs(("corpus",)),
    "index": StageInputs(),
    "agent_base": StageInputs(("corpus.reference_date", "model", "agent", "agent_base")),
    "inject": StageInputs(("injection", "queries", "seeds", "model", "agent", "agent_base"), not_shaping=_LADDER),
    "fit": StageInputs(("methods", METHOD_PARAMS, "fit", "queries.fields", "model", "agent", "agent_base")),
    "unlearn": StageInputs(
        ("methods", METHOD_PARAMS, "p_recipes", "unlearning", "injection", "queries", "seeds", "model", "agent",
         "agent_base"),
        not_shaping=("methods", "p_recipes", "unlearning.out_dir", "injection.out_dir", "injection.calibration",
                     "injection.recall_batch_size", *_LADDER),
    ),
    "probes": StageInputs(
        ("probes", "methods", METHOD_PARAMS, "p_recipes", "injection", "queries", "seeds", "model", "agent",
         "agent_base", "fit.out_dir", "unlearning.out_dir"),
        # the adapters, fitted and unlearned artifacts enter by their hashes; `clean` only reads scores
        not_shaping=("probes.out_dir", "probes.clean", "methods", "p_recipes", "injection", "fit.out_dir",
                     "unlearning.out_dir", *_LADDER),
    ),
    "cell": StageInputs(_CELL, not_shaping=_CELL_NOT_SHAPING),
    "cell_p": StageInputs((*_CELL, "p_recipes", "unlearning"),
                          not_shaping=(*_CELL_NOT_SHAPING, "p_recipes", "unlearning")),
    "controls": StageInputs((*DESIGN_SECTIONS, "scoring", "substrates", "seeds"),
                            not_shaping=("corpus", "scoring", "substrates", "seeds")),
    # the agent base and the corpus enter a session's digest by their hashes
    "replay": StageInputs(("replay", "model", "agent", "agent_base"),
                          not_shaping=("replay.out_dir", "replay.results", "replay.suites", "replay.sessions",
                                       "replay.sweep_suites", "replay.tau_sweep", "replay.indep_sweep",
                                       "replay.checkpoints_sweep", "agent_base")),
    # the memory lane: instances from the corpus; each system's items on the agent base (its hash)
    # and each instance's content (its digest), so which instances exist and the scoring shape none
    "memory_instances": StageInputs(("memory.instances", "memory.source", "memory.per_tier", "memory.seed",
                                     "corpus.reference_date")),
    "memory": StageInputs(("memory", "model", "agent_base"),
                          not_shaping=("memory.instances", "memory.source", "memory.out_dir", "memory.results",
                                       "memory.systems", "memory.per_tier", "memory.seed", "memory.resamples",
                                       "memory.bootstrap_seed", "memory.level", "agent_base")),
    "memory_report": StageInputs(("memory",)),
    # the report: the design's cell runs, and the other lanes' scores where they ran
    "compare": StageInputs(("scoring", "tracking", *DESIGN_SECTIONS, "substrates", "methods", "seeds", "p_recipes",
                            "report", "replay.out_dir", "replay.suites", "replay.sweep_suites", "replay.tau_sweep",
                            "replay.indep_sweep", "replay.checkpoints_sweep", "memory.out_dir", "memory.systems")),
}


def _lookup(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def _cut(value: Any, key: str, cuts: tuple[str, ...]) -> Any:
    """`value` (the params at `key`) without the sub-keys of `cuts` under it."""
    for cut in cuts:
        if cut.startswith(key + "."):
            parent, _, leaf = cut[len(key) + 1:].rpartition(".")
            holder = _lookup(value, parent) if parent else value
            holder.pop(leaf, None)
    return value


def shaping(params: Params, stage: str, *, method: str | None = None) -> dict[str, Any]:
    """The params values that shape one item of `stage`: its shaping keys, without the sub-keys
    it names as not shaping, and of `method_params` only the item's own method's section (none
    for a method without options)."""
    inputs = STAGE_INPUTS[stage]
    data = params.model_dump(mode="json")
    values: dict[str, Any] = {}
    for key in inputs.shaping_keys():
        if key == METHOD_PARAMS:
            if method is not None and method_class(method).Config.model_fields:
                values[key] = method_config(method, params).model_dump(mode="json")
            continue
        try:
            values[key] = _cut(_lookup(data, key), key, inputs.not_shaping)
        except KeyError:  # a key the dump leaves out at its default (a design's digest stays as it was)
            continue
    return values
