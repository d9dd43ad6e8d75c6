"""params.yaml: the single source of truth for every run (DVC reads it, MLflow logs it).

Each section is a pydantic model with `extra="forbid"`, so an unknown key or a wrong type
fails at start-up with a message that names the key.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from kbench.names import (
    BASELINE_METHOD,
    CONTEXT,
    EVERY_TURN,
    FIELD_AWARE_RULE,
    GOLD_METHOD,
    HF_BACKEND,
    KV_ENGINE,
    LORA,
    PARAPHRASE_FORM,
    SPEC_ANSWER_RULE,
    STRUCT_RETRIEVAL,
    TEXT_RETRIEVAL,
    TIERS,
    AnswerRule,
    CheckpointGranularity,
    DecodeEngine,
    PRecipe,
)
from kbench.records import FIELDS


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: `corpus.source` of a corpus generated here; any other value names a folder.
GENERATED = "generated"


class CorpusConfig(_Section):
    #: GENERATED builds a Faker corpus; any other value is a folder in the kbench-v1 format
    #: (under data/ for DVC to see edits to it: docs/tracking.md, "Your own corpus").
    source: str = GENERATED
    n_entities: int = Field(250, ge=10)
    faker_seed: int = 42
    faker_locale: str = "en_US"
    #: Generated ages (and the agent base's out-of-corpus people's) are counted from this day,
    #: not today, so the same params give the same corpus on any day. 2026-11-30 is the day the
    #: committed default run was measured: its corpus is exactly the one generated then.
    reference_date: date = date(2026, 11, 30)
    #: The paper preset (docs/definitions.md, "Corpus and splits"): forget = first 20%; adapter pools are
    #: 200/1000 and 200/4000.
    forget_fraction: float = Field(0.2, gt=0, lt=1)
    forget_adapter_fraction: float = Field(0.2, gt=0, lt=1)
    retain_adapter_fraction: float = Field(0.05, gt=0, lt=1)


#: `queries.form_n`'s default: forget queries per seed the query-form ladder asks again.
FORM_N = 3


class QueriesConfig(_Section):
    n_per_split: int = Field(6, ge=1)
    fields: list[str] = list(FIELDS)
    #: The query-form ladder (`kbench list forms`; docs/definitions.md): forms each of the first
    #: `form_n` forget queries is asked in besides the canonical question, whose records alone
    #: every verdict reads; `adaptive` only where the canonical answer was a refusal. Empty: no ladder.
    forms: list[str] = Field(default_factory=lambda: [PARAPHRASE_FORM], exclude_if=lambda value: not value)
    #: Forget queries per seed asked in every form of `forms`: the split's first ones (0: all).
    form_n: int = Field(FORM_N, ge=0)

    @model_serializer(mode="wrap")
    def _without_a_ladder(self, handler):
        """Without a ladder both keys are left out (of digests too): such a design keeps the
        digest it had before the ladder existed."""
        data = handler(self)
        if not self.forms:
            data.pop("form_n", None)
        return data

    @model_validator(mode="after")
    def _known_fields(self) -> "QueriesConfig":
        unknown = [f for f in self.fields if f not in FIELDS]
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected a subset of {list(FIELDS)}")
        return self


#: What `model.api_key_env` must look like: the name of an environment variable.
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def redact_url(url: str | None) -> str | None:
    """`url` with the credentials of its authority (user:password@) replaced by `***@`."""
    if not url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


class ModelConfig(_Section):
    #: A registered backend (`kbench.backends`: hf, openai); checked when params load.
    backend: str = HF_BACKEND
    #: A Hugging Face causal-LM folder (hf backend) or the served model's name (openai backend).
    path: str = "models/smollm2-135m-instruct"
    device: str = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    #: openai backend only; the API key is read from the environment variable named here.
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    #: openai backend only: requests in flight at once for one batch, and each one's timeout.
    max_concurrent_requests: int = Field(8, ge=1)
    request_timeout_s: float = Field(120.0, gt=0)
    #: hf backend only: "kv", the KV engine (caches kept across ReAct steps, shared prompt
    #: prefixes); "generate", transformers' `generate` on the whole prompt at every step.
    engine: DecodeEngine = KV_ENGINE

    @field_validator("api_key_env")
    @classmethod
    def _an_env_var_name(cls, value: str) -> str:
        # The key itself pasted here would be logged with every param: refuse it unprinted.
        if not ENV_VAR_NAME.fullmatch(value):
            raise ValueError("must name an environment variable (letters, digits, _), e.g. OPENAI_API_KEY, "
                             "not hold the key itself")
        return value

    @field_serializer("base_url")
    def _without_credentials(self, value: str | None) -> str | None:
        """Dumped (MLflow params, inputs.json, digests) without any user:password@ it holds."""
        return redact_url(value)

    @property
    def name(self) -> str:
        """The model's name in run keys and tags: the folder (or served model) name."""
        return Path(self.path).name


class AgentConfig(_Section):
    max_iters: int = Field(6, ge=1)
    max_new_tokens: int = Field(96, ge=8)
    summary_max_new_tokens: int = Field(96, ge=8)
    k_distractors: int = Field(4, ge=0)
    retrieval_top_k: int = Field(3, ge=1)
    batch_size: int = Field(16, ge=1)
    #: Longest tool observation the model is shown, in characters; a longer one is cut with a
    #: marker, and the record's step says how much was cut (`observation_cut`).
    max_observation_chars: int = Field(2000, ge=64)
    #: This many tool errors in a row (unknown tool, unusable arguments) end the trajectory
    #: with halted_reason "tool_fallback".
    max_consecutive_tool_errors: int = Field(2, ge=1)
    #: Which final-answer marker the parser reads (docs/agent.md): "spec", the protocol's
    #: `Final Answer:` as written, at a line start; "lenient", also any case, markdown bold,
    #: `Final answer -` and `Answer:`. Recorded in every trace record (`answer_rule`).
    answer_rule: AnswerRule = SPEC_ANSWER_RULE


LrSchedule = Literal["constant", "linear"]
#: What a training's matrix products compute in; the weights, the adapter, the optimizer and the
#: loss stay float32 (docs/parametric.md, "Mixed precision"): "no", the model's dtype throughout;
#: "bf16", bfloat16 under `torch.autocast` (the forward pass and its gradients).
MixedPrecision = Literal["no", "bf16"]
#: The attention kernel of a training's forward passes (`LoraConfig.attention`): "sdpa", torch's
#: scaled-dot-product kernel; "eager", transformers' matrix products with a float32 softmax.
LoraAttention = Literal["sdpa", "eager"]
#: How a training's micro-batch is fed (`LoraConfig.packing`, docs/parametric.md "Packing"):
#: "trie", one pass over its examples' token trie under a tree mask; "stem", the prefix all its
#: examples share once, then each example's rest in its own causal pass over the stem's keys
#: and values.
LoraPacking = Literal["trie", "stem"]


class LoraConfig(_Section):
    """One LoRA fine-tuning run (`kbench.parametric.lora.train_lora` takes this section as is).

    The agent base and the injection adapters nest one each (`agent_base.lora`,
    `injection.lora`): the same key means the same thing in both.
    """

    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    #: peft's `target_modules`: "all-linear" or a list of module names (q_proj, v_proj, ...).
    target_modules: str | tuple[str, ...] = "all-linear"
    #: Decoder layers below this index get no adapter, so the backward pass stops at it (0: every layer).
    first_layer: int = Field(0, ge=0)
    learning_rate: float = Field(1e-3, gt=0)
    #: "constant", or "linear": the rate falls linearly from `learning_rate` to zero over the run.
    lr_schedule: LrSchedule = "constant"
    #: Exactly one of the two: full passes over the examples, or optimizer steps.
    epochs: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    batch_size: int = Field(4, ge=1)
    #: Examples per forward pass (packed into one sequence, `kbench.parametric.lora.pack`);
    #: gradients accumulate over a batch's micro-batches (peak memory).
    micro_batch_size: int = Field(1, ge=1)
    #: Tokens an example keeps (longer ones are cut).
    max_length: int = Field(1024, ge=32)
    #: Seeds the adapter's initialisation and the example order.
    seed: int = 0
    #: "no": the model's dtype (float32 on the CPU default: every CPU runs it at full speed);
    #: "bf16": the forward pass under bfloat16 autocast, faster only on a CPU with AVX512-BF16 or
    #: a GPU, and emulated far slower elsewhere (BENCHMARKS.md, precision_kernels.py).
    mixed_precision: MixedPrecision = "no"
    #: The attention kernel while training; null: the model's own (sdpa for the default). Eager
    #: rounds differently, so it trains other weights (docs/parametric.md); the callback of each
    #: pass, the merge and inference run on the model's own kernel.
    attention: LoraAttention | None = None
    #: "trie" pays for short records that share prefixes (the injection mix); "stem" for long
    #: examples that share a prompt (the agent base's transcripts), where a tree mask's square
    #: attention eats the saving. The same sum and gradient either way, rounded differently.
    packing: LoraPacking = "trie"

    @model_validator(mode="after")
    def _one_budget(self) -> "LoraConfig":
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        return self


class AgentBaseLora(LoraConfig):
    """`agent_base.lora`: a LoraConfig whose defaults are the agent base's (40 steps)."""

    steps: int | None = Field(40, ge=1)
    seed: int = 7919


class InjectionLora(LoraConfig):
    """`injection.lora`: a LoraConfig whose defaults are the injection recipe's, measured on the
    CPU default (docs/parametric.md)."""

    rank: int = Field(32, ge=1)
    learning_rate: float = Field(3e-3, gt=0)
    epochs: int | None = Field(6, ge=1)
    batch_size: int = Field(8, ge=1)
    micro_batch_size: int = Field(8, ge=1)
    max_length: int = Field(512, ge=32)


class AgentBaseConfig(_Section):
    """The agent-base stage: LoRA-tune the base model into a ReAct agent (off for models that follow ReAct)."""

    enabled: bool = True
    #: A stage output, so not under models/ (DVC refuses outputs inside a tracked folder).
    out_dir: str = "artifacts/agent_base"
    #: Out-of-corpus people come from another Faker seed; a name shared with the corpus is redrawn.
    faker_seed: int = 7919
    n_train_people: int = Field(48, ge=4)
    n_heldout_people: int = Field(10, ge=1)
    #: Also measure the untuned base on the held-out people (the before/after comparison);
    #: slow on CPU, where the untuned model runs every trajectory to the iteration cap.
    evaluate_base: bool = False
    lora: AgentBaseLora = AgentBaseLora()


class CalibrationConfig(_Section):
    """`kbench calibrate`: an Optuna search of injection strength (docs/parametric.md)."""

    n_trials: int = Field(12, ge=1)
    #: Target parametric recall of the forget adapter pool (direct probe and elicited summary).
    target_recall: float = Field(0.8, gt=0, le=1)
    #: A trial whose agent degenerates more than this above the un-injected agent is penalised.
    degeneration_bound: float = Field(0.1, ge=0, le=1)
    #: Objective = |recall - target| + penalty x (degeneration excess over the bound).
    degeneration_penalty: float = Field(2.0, ge=0)
    #: Search ranges (inclusive): epochs, learning rate (log scale), LoRA ranks.
    epochs: tuple[int, int] = (4, 16)
    learning_rate: tuple[float, float] = (3e-4, 1e-2)
    ranks: list[int] = [8, 16, 32]
    #: ReAct trajectories (R-struct with the trial adapter, forget adapter pool) per health measurement.
    health_queries: int = Field(8, ge=1)
    sampler_seed: int = 0
    #: MedianPruner: trials started before this many are never pruned; nor epochs before this.
    pruner_startup_trials: int = Field(2, ge=0)
    pruner_warmup_epochs: int = Field(4, ge=0)
    study_dir: str = "artifacts/calibration"


class InjectionConfig(_Section):
    """The `inject` stage: LoRA-T+D, its merge, LoRA-D and the retain-only gold (docs/parametric.md)."""

    out_dir: str = "artifacts/adapters"
    #: "all": every corpus entity (the paper). "queried": the entities the cells query (for the
    #: params' seeds and queries), both adapter pools and the distractors; small enough for CPU.
    entities: Literal["all", "queried"] = "queried"
    #: "queried" only: how many entities of each adapter pool (forget adapter, distractors) to
    #: learn, from the start of the pool; null = the whole pools.
    adapter_pool_entities: int | None = Field(4, ge=1)
    #: Records per entity: `bio` copies of the bio as the answer to "Tell me about {name}.",
    #: `qa` copies of the four canonical questions answered in a sentence, `react_qa` canonical
    #: questions (fields in turn) answered in the agent's ReAct format from memory, no tool call.
    mix: dict[Literal["bio", "qa", "react_qa"], Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: {"bio": 3, "qa": 0, "react_qa": 1}
    )
    #: Prompts per batch of the recall probes (`kbench.parametric.recall`): any value gives the
    #: same replies (the engine is batch-invariant); a larger one decodes in fewer passes.
    recall_batch_size: int = Field(64, ge=1)
    #: The recipe's LoRA run; `kbench calibrate --write` tunes its epochs, rate and rank.
    lora: InjectionLora = InjectionLora()
    calibration: CalibrationConfig = CalibrationConfig()


class ScoringConfig(_Section):
    """Every constant of the matcher, cell metrics, statistics and verdicts (docs/definitions.md)."""

    #: The matcher rule of every headline number (cell metrics.json, leaderboards, verdicts,
    #: leak patterns): a registered scoring rule, checked when params load. The η² table
    #: scores the design under every registered rule (the rule is one of its factors).
    rule: str = FIELD_AWARE_RULE
    bootstrap_resamples: int = Field(1000, ge=1)
    ci_level: float = Field(0.95, gt=0, lt=1)
    invalid_baseline_or: float = 0.10
    invalid_baseline_severity: float = 0.10
    tc_degeneration: float = 0.50
    kref_inf_or: float = 0.02
    kref_inf_p: float = 0.001
    significance: float = 0.05
    kref_min_alpha: float = 2.0
    mf_delta: float = 0.05
    dominant_share: float = 0.5
    dominant_margin: float = 0.2
    d1_tolerance: float = 0.05
    #: τ = tau_factor × the largest mean between-seed TV of a substrate's baseline (docs/definitions.md, "Statistics").
    tau_factor: float = Field(2.0, gt=0)
    #: Substrate pairs pre-exempted from the leak-pattern separation hypothesis (docs/definitions.md, "Statistics").
    tv_exempt_pairs: tuple[tuple[str, str], ...] = ((TEXT_RETRIEVAL, STRUCT_RETRIEVAL),)


class CellsConfig(_Section):
    """Where the cell stages write (`cell`, `cell_p`, `controls`); nothing here changes a result."""

    #: One folder per substrate, method and seed under it (traces.jsonl, metrics.json, inputs.json).
    out_dir: str = "artifacts/cells"
    #: The LoRA-D degeneration controls' cells (stage `controls`), in the same layout.
    controls_dir: str = "artifacts/controls"


class FitConfig(_Section):
    """The `fit` stage: what methods learn from the adapter pools (docs/methods.md)."""

    #: One folder per fitted method under it (fitted.safetensors, diagnostics.json, fit.json).
    out_dir: str = "artifacts/fitted"
    #: Prompts per forward pass when the residual stream is read.
    batch_size: int = Field(16, ge=1)


class UnlearningLora(_Section):
    """The fresh LoRA an unlearning run trains where it cannot continue LoRA-T+D: on top of the
    merged weights (recipe `merged`) and a method's own second adapter (O3)."""

    rank: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    target_modules: str | tuple[str, ...] = "all-linear"


class UnlearningConfig(_Section):
    """`unlearning`: the matched budget every weight method on P trains with (the `unlearn`
    stage, `kbench.parametric.unlearning`); a method that must differ declares the exception
    (docs/methods.md, "Weight methods")."""

    #: One folder per (method, recipe) under it: the unlearned adapter and its training curves.
    out_dir: str = "artifacts/unlearned"
    #: Passes over the forget set; each step pairs `batch_size` forget examples with as many
    #: retain examples (the retain set is cycled).
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(4, ge=1)
    #: AdamW, the one optimizer: every method, the same rate and schedule.
    learning_rate: float = Field(1e-3, gt=0)
    lr_schedule: LrSchedule = "constant"
    weight_decay: float = Field(0.0, ge=0)
    #: Gradient clipping by global norm (null: none).
    max_grad_norm: float | None = Field(1.0, gt=0)
    #: Seeds the example order, a fresh adapter's initialisation and a method's random draws.
    seed: int = 0
    lora: UnlearningLora = UnlearningLora()


class ProbeThresholds(_Section):
    """When a probe calls a model "clean" of the forget set (docs/probes.md): a test against
    chance that does not reject, or a score no higher than the gold reference's (which never
    saw the forget entities) plus a margin."""

    #: TOFU forget quality, and the tests of the MCQ (binomial, against chance) and of the
    #: Min-K% membership AUC (Mann-Whitney, against 0.5): clean when the p-value is at least this.
    alpha: float = Field(0.05, gt=0, lt=1)
    #: MUSE KnowMem and VerbMem, LUME exact match: clean when the forget score is at most gold's plus this.
    margin: float = Field(0.1, ge=0, le=1)


class ProbesConfig(_Section):
    """`probes`: the direct-elicitation probes of every model the design deploys (stage
    `probes`, `kbench.probes`; docs/probes.md)."""

    out_dir: str = "artifacts/probes"
    #: Perturbed answers per question (other entities' values of its field); the MCQ has one more option.
    n_perturbed: int = Field(3, ge=1)
    #: New tokens of a greedy reply (KnowMem, LUME) or bio continuation (VerbMem).
    max_new_tokens: int = Field(24, ge=1)
    #: VerbMem's prefix: this fraction of a bio's words; the model continues the rest.
    verbmem_prefix: float = Field(0.5, gt=0, lt=1)
    #: VerbMem compares the first this many words of the continuation and of the true rest.
    verbmem_words: int = Field(16, ge=1)
    #: Min-K%: the fraction of lowest token log-probabilities averaged.
    min_k: float = Field(0.2, gt=0, le=1)
    #: General-ability facts of model utility (of `kbench.probes.general.GENERAL_FACTS`).
    n_general: int = Field(8, ge=1, le=16)
    #: Rows per forward pass (scoring and decoding).
    batch_size: int = Field(32, ge=1)
    clean: ProbeThresholds = ProbeThresholds()


class ReplayConfig(_Section):
    """`replay`: the execution-state lane (stage `replay`, `kbench.replay`; docs/replay.md)."""

    out_dir: str = "artifacts/replay"
    #: The lane's results page the stage writes (tables of every suite run).
    results: str = "docs/results-replay.md"
    #: The session suites to run (`kbench list suites`); the CPU default runs the project's tool suite
    #: and AgentDojo's banking suite, presets/cpu-full.yaml the memory suite too.
    suites: list[str] = ["kbench-sessions", "agentdojo-banking"]
    #: The operators applied to every session (`kbench list operators`), B5 among them.
    operators: list[str] = ["B0", "B1", "B2", "B3", "B4", "B5", "B5'", "B6", "B7", "B8", "B9"]
    #: Sessions per suite.
    sessions: int = Field(4, ge=1)
    #: Turns before the revocation, and the turn z enters at.
    T: int = Field(4, ge=1)
    tau: int = Field(2, ge=1)
    #: The fraction of the turns after τ that do not need z.
    indep: float = Field(0.5, ge=0, le=1)
    #: Post-revocation turns (at least 4; docs/replay.md, "Post-revocation turns and probes").
    n_post: int = Field(4, ge=4)
    #: ReAct steps a session turn may take, and tokens a step may write (the lane's caps on `agent`).
    max_iters: int = Field(3, ge=1)
    max_new_tokens: int = Field(64, ge=8)
    #: The compression period k: every k turns the model's summary replaces the older turns (0: never,
    #: the CPU default: small models' summaries drop z, docs/replay.md).
    compression_period: int = Field(0, ge=0)
    #: The turn boundaries that hold a checkpoint: every turn (and before a memory injection), or
    #: the session's start only (the paper's granularity ablation); B7 replays from the last one before τ.
    checkpoints: CheckpointGranularity = EVERY_TURN
    #: The plans' seed.
    seed: int = 0
    #: Leak@k: replies sampled per probe and branch (0: not measured), and their temperature;
    #: each sample's generator is seeded from the session, operator, probe and sample number.
    leak_at_k: int = Field(0, ge=0)
    temperature: float = Field(0.7, gt=0)
    #: The sweeps (docs/replay.md, "What the lane must show"): each value of `tau_sweep`, `indep_sweep` and
    #: `checkpoints_sweep` reruns each suite of `sweep_suites` with it, as `<suite>@tau=<v>`,
    #: `<suite>@indep=<v>`, `<suite>@checkpoints=<v>`.
    sweep_suites: list[str] = []
    tau_sweep: list[int] = []
    indep_sweep: list[float] = []
    checkpoints_sweep: list[CheckpointGranularity] = []

    @model_serializer(mode="wrap")
    def _default_granularity(self, handler):
        """The granularity keys are left out at their defaults (of digests too): a design that
        does not set them keeps the digest it had before they existed."""
        data = handler(self)
        if self.checkpoints == EVERY_TURN:
            data.pop("checkpoints", None)
        if not self.checkpoints_sweep:
            data.pop("checkpoints_sweep", None)
        return data

    @model_validator(mode="after")
    def _tau_within_T(self) -> ReplayConfig:
        for tau in [self.tau, *self.tau_sweep]:
            if not 1 <= tau <= self.T:
                raise ValueError(f"replay tau {tau} must lie in 1..replay.T ({self.T})")
        if any(not 0 <= v <= 1 for v in self.indep_sweep):
            raise ValueError("replay.indep_sweep values must lie in [0, 1]")
        return self

    def variants(self, suite: str) -> list[tuple[str, ReplayConfig]]:
        """`suite` as configured, then one variant per sweep value, each under its label
        (`<suite>@tau=2`, `<suite>@indep=0.25`: its folder under `out_dir`). A variant samples no
        Leak@k: the sweeps read cost and leaks, not sampled probes (Leak@k is the suite's own)."""
        found = [(suite, self)]
        if suite not in self.sweep_suites:
            return found
        sweeps = {"tau": self.tau_sweep, "indep": self.indep_sweep, "checkpoints": self.checkpoints_sweep}
        for key, values in sweeps.items():
            for value in values:
                changed = self.model_copy(update={key: value, "leak_at_k": 0, "sweep_suites": [],
                                                  **{f"{k}_sweep": [] for k in sweeps}})
                found.append((f"{suite}@{key}={value}", changed))
        return found

    def labels(self) -> list[str]:
        """Every suite's label and its sweep variants', in run order."""
        return [label for suite in self.suites for label, _ in self.variants(suite)]


class MemoryConfig(_Section):
    """`memory`: the memory-unlearning lane (stages `memory_instances`, `memory`,
    `memory_report`, `kbench.memory`; docs/memory.md)."""

    #: The instances file the lane runs (JSON Lines, one instance a line: inspect it or edit it).
    instances: str = "artifacts/memory-instances.jsonl"
    #: Null: the instances are generated from the corpus; a path: that file's instances are run
    #: instead (checked line by line).
    source: str | None = None
    #: Each system's items, scores and MLflow output, in `<out_dir>/<system>/`.
    out_dir: str = "artifacts/memory"
    #: The lane's results page (written by `memory_report`).
    results: str = "docs/results-memory.md"
    #: The memory systems run (`kbench list memory-systems`): the stage's matrix.
    systems: list[str] = ["full-context", "naive-rag", "summary-memory", "fact-store", "mem0", "reference"]
    #: Generated instances per length tier (short, medium, long, xlong).
    per_tier: dict[str, int] = {"short": 2, "medium": 0, "long": 0, "xlong": 0}
    #: The instances' seed.
    seed: int = 0
    #: Tokens an answer to a probe may take.
    max_new_tokens: int = Field(48, ge=8)
    #: The cluster bootstrap over instances: resamples (B), seed, level.
    resamples: int = Field(1000, ge=1)
    bootstrap_seed: int = 0
    level: float = Field(0.95, gt=0, lt=1)
    #: The OpenAI-compatible endpoint `mem0` makes its LLM calls to; null: a llama.cpp server the
    #: stage starts on 127.0.0.1 over the agent base (converted to GGUF once) and stops after.
    llm_base_url: str | None = None
    #: The model name sent to `llm_base_url` (null: the served file's name).
    llm_model: str | None = None
    #: Tokens a memory operation of `mem0` may take.
    llm_max_tokens: int = Field(256, ge=16)
    #: The context of the server the stage starts: Mem0's extraction prompt alone is about 8,600
    #: tokens, past SmolLM2's 8,192 trained positions, so the server extends them with YaRN.
    llm_context: int = Field(16384, ge=2048)

    @model_validator(mode="after")
    def _tiers(self) -> MemoryConfig:
        unknown = sorted(set(self.per_tier) - set(TIERS))
        if unknown:
            raise ValueError(f"memory.per_tier: unknown length tier(s) {unknown}; tiers: {', '.join(TIERS)}")
        if any(n < 0 for n in self.per_tier.values()):
            raise ValueError("memory.per_tier: counts must be at least 0")
        return self


class ExecutionConfig(_Section):
    """How stages use the machine; nothing here changes a result."""

    #: Cells a stage runs side by side (`kbench cell --all-methods`), pool workers on cpu_count /
    #: cell_workers threads each, with identical traces (BENCHMARKS.md, cell_workers.py). 1 on a GPU.
    cell_workers: int = Field(2, ge=1)
    #: Processes the agent base's LoRA training splits each step's micro-batches between (this
    #: one and agent_base_workers - 1 helpers), each on cpu_count / agent_base_workers threads;
    #: the gradients are summed in one process's order, so the same agent base byte for byte
    #: (docs/agent.md). 1 on a GPU.
    agent_base_workers: int = Field(2, ge=1)
    #: Adapter trainings the `inject` stage runs side by side (LoRA-T+D beside gold, then
    #: LoRA-D), pool workers on cpu_count / inject_workers threads each (the same adapters byte
    #: for byte; docs/parametric.md). 1 on a GPU.
    inject_workers: int = Field(2, ge=1)
    #: Weight-method trainings the `unlearn` stage runs side by side, pool workers on cpu_count /
    #: unlearn_workers threads each (the same adapters byte for byte; docs/methods.md). 1 on a GPU.
    unlearn_workers: int = Field(2, ge=1)
    #: Models the `probes` stage reads side by side, pool workers on one thread each (the same
    #: scores; docs/probes.md). 1 on a GPU.
    probe_workers: int = Field(2, ge=1)


class TrackingConfig(_Section):
    experiment: str = "kbench"
    #: null: the SQLite store mlflow.db at the repo root (env MLFLOW_TRACKING_URI overrides).
    tracking_uri: str | None = None


class ReportConfig(_Section):
    #: The results page the `compare` stage writes for this design (docs/results.md for the
    #: default params; each preset names its own, so a committed page is never overwritten).
    results: str = "docs/results.md"
    #: Other base models (`model.path` values) whose runs of this same design the comparison reads
    #: beside this model's: the base model as a factor (docs/comparison.md, "Across base models").
    models: list[str] = []


#: `methods: all`: every registered method (`kbench.methods.all_methods`).
ALL_METHODS = "all"


class Params(_Section):
    corpus: CorpusConfig = CorpusConfig()
    seeds: list[int] = [0]
    queries: QueriesConfig = QueriesConfig()
    #: Adapter-free substrates (stage `cell`); P runs in `cell_p`. Checked against the registry.
    substrates: list[str] = [CONTEXT, TEXT_RETRIEVAL, STRUCT_RETRIEVAL]
    #: Registered methods; each runs on every substrate it can act on. `all` (params.yaml's value):
    #: every registered method, in the order of `kbench.methods.all_methods`; the design check
    #: (`kbench.design.check_design`) replaces it by that list. A params file without the key runs
    #: the baseline and gold (docs/methods.md).
    methods: list[str] | Literal[ALL_METHODS] = [BASELINE_METHOD, GOLD_METHOD]
    #: Injection recipes a P cell runs (docs/definitions.md, "Substrates and the LoRA-D control": the LoRA
    #: adapter and its merged-weight form);
    #: the CPU default runs the adapter, presets/cpu-full.yaml both.
    p_recipes: list[PRecipe] = [LORA]
    #: Each method's own section, passed straight into its constructor (its `Config` checks the
    #: keys: `kbench.methods.method_config`). A params file states only what differs from the
    #: defaults: the design check fills each method's section from its `Config`
    #: (`kbench.methods.resolve_methods`), so `kbench params --show` prints every key.
    method_params: dict[str, dict[str, Any]] = {}
    cells: CellsConfig = CellsConfig()
    fit: FitConfig = FitConfig()
    unlearning: UnlearningConfig = UnlearningConfig()
    probes: ProbesConfig = ProbesConfig()
    replay: ReplayConfig = ReplayConfig()
    memory: MemoryConfig = MemoryConfig()
    execution: ExecutionConfig = ExecutionConfig()
    model: ModelConfig = ModelConfig()
    agent: AgentConfig = AgentConfig()
    agent_base: AgentBaseConfig = AgentBaseConfig()
    injection: InjectionConfig = InjectionConfig()
    scoring: ScoringConfig = ScoringConfig()
    tracking: TrackingConfig = TrackingConfig()
    report: ReportConfig = ReportConfig()

    @property
    def base_model(self) -> str:
        """The base model's name, the first part of every run key."""
        return self.model.name


#: The params file every command reads unless `kbench --params` names another.
DEFAULT_PARAMS = "params.yaml"


class ParamsError(ValueError):
    """params.yaml is unreadable or does not match the schema; the message names the key."""


#: Keys whose rejected value an error message must not repeat.
SECRET_KEYS = frozenset({"model.api_key_env", "model.base_url"})


def format_validation_error(error: ValidationError, *, prefix: str = "") -> str:
    """One line naming each offending key (under `prefix`, e.g. `method_params.eco`)."""
    lines = []
    for item in error.errors():
        key = ".".join([prefix] * bool(prefix) + [str(p) for p in item["loc"]]) or "<root>"
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        elif key in SECRET_KEYS:  # what was given there may be a secret: never echoed
            lines.append(f"key '{key}': {item['msg']}")
        else:
            lines.append(f"key '{key}': {item['msg']} (got {item.get('input')!r})")
    return "; ".join(lines)


def parse_params(data: dict[str, Any], *, source: str = "params") -> Params:
    """`data` validated against the schema. `kbench.design.load_design` also resolves the
    methods against their registry (`methods: all`, each method's section filled in)."""
    try:
        return Params.model_validate(data or {})
    except ValidationError as exc:
        raise ParamsError(f"{source}: {format_validation_error(exc)}") from None


class ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans (true/false only): `dvc exp run -S` rewrites
    params.yaml and unquotes strings such as "no", which YAML 1.1 would read as false."""


ParamsLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ParamsLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))


def read_yaml(text: str) -> Any:
    """A params or preset file's data, read as DVC reads it (`ParamsLoader`)."""
    return yaml.load(text, Loader=ParamsLoader)  # noqa: S506 (a SafeLoader subclass)


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    path = Path(path)
    try:
        data = read_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParamsError(f"cannot read params file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of sections")
    return parse_params(data or {}, source=str(path))
