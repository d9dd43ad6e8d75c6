"""params.yaml: the single source of truth for every run (DVC reads it, MLflow logs it).

Each section is a pydantic model with `extra="forbid"`, so an unknown key or a wrong type
fails at start-up with a message that names the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kbench.records import FIELDS


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorpusConfig(_Section):
    #: "generated" builds a Faker corpus; any other value is a folder in the kbench-v1 format.
    source: str = "generated"
    n_entities: int = Field(250, ge=10)
    faker_seed: int = 42
    faker_locale: str = "en_US"
    #: SPEC §2 paper preset: forget = first 20%; adapter pools are 200/1000 and 200/4000.
    forget_fraction: float = Field(0.2, gt=0, lt=1)
    forget_adapter_fraction: float = Field(0.2, gt=0, lt=1)
    retain_adapter_fraction: float = Field(0.05, gt=0, lt=1)


class QueriesConfig(_Section):
    n_per_split: int = Field(4, ge=1)
    fields: list[str] = list(FIELDS)

    @model_validator(mode="after")
    def _known_fields(self) -> "QueriesConfig":
        unknown = [f for f in self.fields if f not in FIELDS]
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected a subset of {list(FIELDS)}")
        return self


class ModelConfig(_Section):
    backend: Literal["hf", "openai"] = "hf"
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


class AgentConfig(_Section):
    max_iters: int = Field(6, ge=1)
    max_new_tokens: int = Field(96, ge=8)
    summary_max_new_tokens: int = Field(96, ge=8)
    k_distractors: int = Field(4, ge=0)
    retrieval_top_k: int = Field(3, ge=1)
    batch_size: int = Field(16, ge=1)
    #: This many tool errors in a row (unknown tool, unusable arguments) end the trajectory
    #: with halted_reason "tool_fallback".
    max_consecutive_tool_errors: int = Field(2, ge=1)


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
    evaluate_base: bool = True
    steps: int = Field(40, ge=1)
    batch_size: int = Field(4, ge=1)
    #: Rows per forward pass; gradients accumulate over a batch's micro-batches (peak memory).
    micro_batch_size: int = Field(1, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    lora_rank: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    max_length: int = Field(1024, ge=64)


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
    rank: int = Field(32, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"
    #: CPU default measured on SmolLM2-135M (docs/parametric.md): 8 epochs at 3e-3 recall about
    #: 70% of the learned fields by the direct probe. Paper preset: 4 epochs at 1e-4.
    epochs: int = Field(8, ge=1)
    learning_rate: float = Field(3e-3, gt=0)
    #: "constant" or "linear" (decays to zero over the run). Measured on the CPU default: linear
    #: ends at a far lower loss but recalls no more, and costs retain OR (docs/parametric.md).
    lr_schedule: Literal["constant", "linear"] = "constant"
    batch_size: int = Field(8, ge=1)
    micro_batch_size: int = Field(4, ge=1)
    max_length: int = Field(512, ge=32)
    seed: int = 0
    calibration: CalibrationConfig = CalibrationConfig()


class ScoringConfig(_Section):
    """Every constant of SPEC §8-§10."""

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
    #: τ = tau_factor × the largest mean between-seed TV of a substrate's baseline (SPEC §9).
    tau_factor: float = Field(2.0, gt=0)
    #: Substrate pairs pre-exempted from the leak-pattern separation hypothesis (SPEC §9).
    tv_exempt_pairs: tuple[tuple[str, str], ...] = (("R-text", "R-struct"),)


class TrackingConfig(_Section):
    experiment: str = "kbench"
    #: null: the SQLite store mlflow.db at the repo root (env MLFLOW_TRACKING_URI overrides).
    tracking_uri: str | None = None


class Params(_Section):
    corpus: CorpusConfig = CorpusConfig()
    seeds: list[int] = [0]
    queries: QueriesConfig = QueriesConfig()
    substrates: list[str] = ["C", "R-text", "R-struct"]
    methods: list[str] = ["none"]
    #: Injection recipes a P cell runs (SPEC §3: the LoRA adapter and its merged-weight form).
    p_recipes: list[Literal["lora", "merged"]] = ["lora", "merged"]
    model: ModelConfig = ModelConfig()
    agent: AgentConfig = AgentConfig()
    agent_base: AgentBaseConfig = AgentBaseConfig()
    injection: InjectionConfig = InjectionConfig()
    scoring: ScoringConfig = ScoringConfig()
    tracking: TrackingConfig = TrackingConfig()


class ParamsError(ValueError):
    """params.yaml is unreadable or does not match the schema; the message names the key."""


def _format(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"key '{key}': {item['msg']} (got {item.get('input')!r})")
    return "; ".join(lines)


def parse_params(data: dict[str, Any], *, source: str = "params") -> Params:
    try:
        return Params.model_validate(data or {})
    except ValidationError as exc:
        raise ParamsError(f"{source}: {_format(exc)}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParamsError(f"cannot read params file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of sections")
    return parse_params(data or {}, source=str(path))
