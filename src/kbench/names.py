"""The registered names the core refers to, each defined once and imported everywhere else.

The registries (`kbench.backends`, `kbench.substrates`, `kbench.methods`) say which names
exist; this module only names the entries that core code must refer to: the four substrates
of docs/definitions.md, "Substrates and the LoRA-D control", the baseline and gold methods, the default
backend, the injection recipes, the
matcher's scoring rules and the ReAct parser's answer rules.
A plug-in registers its own name in its own module and never needs an entry here.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The substrates the core refers to by name (docs/definitions.md, "Substrates and the LoRA-D control");
#: `kbench.substrates` registers them under these names.
PARAMETRIC, CONTEXT, TEXT_RETRIEVAL, STRUCT_RETRIEVAL = "P", "C", "R-text", "R-struct"
#: The no-intervention baseline every method is compared with (`kbench.methods.none`).
BASELINE_METHOD = "none"
#: The retain-only reference, scored like a method on P (`kbench.methods.gold`).
GOLD_METHOD = "gold"

#: How a cell's model holds an injection (docs/definitions.md, "Substrates and the LoRA-D control"):
#: adapter-free, the LoRA-T+D adapter, that
#: adapter merged into the weights, or the LoRA-D degeneration control.
Recipe = Literal["none", "lora", "merged", "lora-d"]
PRecipe = Literal["lora", "merged"]
RECIPES: tuple[str, ...] = get_args(Recipe)
P_RECIPES: tuple[str, ...] = get_args(PRecipe)
ADAPTER_FREE, LORA, MERGED, CONTROL = RECIPES

#: The query form the default design asks besides the canonical question (`kbench.forms.paraphrase`).
PARAPHRASE_FORM = "paraphrase"

#: The local transformers backend (`kbench.backends.hf`), the default and the one with weights.
HF_BACKEND = "hf"

#: The matcher rules the core refers to (`kbench.observer.matcher` registers them): the
#: field-aware variants (the default, as published; docs/definitions.md, "The matcher") and the ground-truth
#: string alone.
FIELD_AWARE_RULE, STRICT_RULE = "field-aware", "strict"

#: Which marker ends a ReAct step with a final answer (`kbench.agent.parser`, docs/agent.md):
#: `Final Answer:` as the protocol writes it (the default), or the lenient reading that also takes
#: any case, markdown bold, `Final answer -` and `Answer:`.
AnswerRule = Literal["spec", "lenient"]
ANSWER_RULES: tuple[str, ...] = get_args(AnswerRule)
SPEC_ANSWER_RULE, LENIENT_ANSWER_RULE = ANSWER_RULES

#: How the hf backend decodes (`kbench.backends.hf`, docs/agent.md): the KV engine, which keeps
#: each trajectory's cache across ReAct steps and shares prompt prefixes (the default), or
#: transformers' `generate`, which re-encodes every prompt (the reference the engine is checked
#: against, and a fallback for a model whose cache the engine cannot hold).
DecodeEngine = Literal["kv", "generate"]
DECODE_ENGINES: tuple[str, ...] = get_args(DecodeEngine)
KV_ENGINE, GENERATE_ENGINE = DECODE_ENGINES

#: The execution-state lane's checkpoint granularity (`replay.checkpoints`, docs/replay.md): a
#: checkpoint at every turn boundary, or at the session's start only.
CheckpointGranularity = Literal["every_turn", "session_start"]
CHECKPOINT_GRANULARITIES: tuple[str, ...] = get_args(CheckpointGranularity)
EVERY_TURN, SESSION_START = CHECKPOINT_GRANULARITIES

#: The memory lane's instance length tiers (docs/memory.md, "Instances, requests and probes";
#: `memory.per_tier`, `kbench.memory`).
Tier = Literal["short", "medium", "long", "xlong"]
TIERS: tuple[str, ...] = get_args(Tier)

#: The models the probes stage reads (`kbench.stages.probes`), as the comparison finds them in
#: its summary file: the agent base (what C, R-text and R-struct deploy), the LoRA-D control,
#: and on P one key per (recipe, method), `probed_p_key`.
PROBED_AGENT_BASE, PROBED_CONTROL = "agent-base", "lora-d"
PROBES_SUMMARY_FILE = "summary.json"
#: The scores a lane's stage writes in each suite's (`replay`) or system's (`memory`) folder, which
#: the lane's page and the report read.
LANE_SCORES_FILE = "scores.json"


def probed_p_key(recipe: str, method: str) -> str:
    return f"{PARAMETRIC}__{recipe}__{method}"
