"""Substrate P's weights: the `inject` stage and the check every adapter passes before a cell loads it.

Four outputs under `injection.out_dir` (docs/parametric.md):

    lora_td/    LoRA-T+D: a LoRA adapter on the agent base, fine-tuned on the records (bios and
                question-answer pairs) of the targets and the distractors
    merged_td/  the same adapter merged into the base weights (a full model folder)
    lora_d/     LoRA-D: the same recipe on the distractors alone, never on a target (the
                degeneration control loaded with C, R-text and R-struct)
    gold/       the same recipe on the retain entities alone, never on a forget entity (the
                retain-only reference, scored as method `gold` on P)

Which entities LoRA-T+D learns (`injection.entities`): "all" is the paper's (every corpus
entity); "queried" keeps what the benchmark reads on CPU: both adapter pools (detectors,
directions and calibration use them; the retain adapter pool is the distractor pool) and the
eval-pool entities the cells query for the params' seeds and query counts. Retain entities the
cells query are learned too: selectivity (Δsel) needs the agent to know what it must keep.
Gold is that set without its forget entities; LoRA-D is the distractor pool.

Every adapter folder carries `injection.json`: its role, the entities it learned, a
fingerprint of the base model it was trained on, the recipe and its training metrics.
`check_injected` reads it with the peft files and refuses a folder that is corrupt, was
trained on another base, or does not fit the cell (a gold cell must load the gold adapter, a
LoRA-D control the distractor adapter).
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kbench import tracking
from kbench.agent.prompts import react_conversation, summary_conversation
from kbench.cells import base_model_name
from kbench.config import InjectionConfig, Params
from kbench.corpus import Corpus
from kbench.lora import EpochCallback, Example, LoraRun, LoraSettings, tokenize_chat, train_lora
from kbench.matcher import match
from kbench.methods.gold import GOLD_METHOD
from kbench.records import FIELD_PHRASES, FIELDS, Entity, Query

log = logging.getLogger(__name__)

INJECTION_FILE = "injection.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Adapter roles and their folders under injection.out_dir.
TARGET, DISTRACTOR, GOLD = "target", "distractor", "gold"
ADAPTER_DIRS = {TARGET: "lora_td", DISTRACTOR: "lora_d", GOLD: "gold"}
MERGED_DIR = "merged_td"
#: The persona of the plain (non-ReAct) records; the elicited summary speaks to the same one.
ASSISTANT_SYSTEM = "You are a helpful assistant."
#: New tokens of a direct-probe answer: one sentence ("{name}'s {field} is {value}.") fits in
#: about 30, so a longer cap only lets a rambling reply cost time.
DIRECT_PROBE_TOKENS = 48
#: Bytes read at evenly spaced offsets of each weight file for the base-model fingerprint.
_SAMPLE_BYTES, _SAMPLES = 1 << 16, 32


class InjectionError(ValueError):
    """An adapter or merged model is missing, corrupt, trained on another base, or the wrong role."""


# -- which entities each adapter learns ------------------------------------------------------
def queried_entities(corpus: Corpus, params: Params) -> dict[str, list[str]]:
    """Per split, the entities the cells query for the params' seeds and query counts."""
    fields = tuple(params.queries.fields)
    return {
        split: sorted({
            q.entity_id
            for seed in params.seeds
            for q in corpus.sample_queries(split, params.queries.n_per_split, seed, fields)
        })
        for split in ("forget", "retain")
    }


def adapter_pool(corpus: Corpus, params: Params, pool: str) -> list[str]:
    """The learned part of an adapter pool ("forget_adapter" or "distractors"), as configured."""
    ids = corpus.distractor_ids if pool == "distractors" else corpus.pools[pool]
    limit = params.injection.adapter_pool_entities if params.injection.entities == "queried" else None
    return list(ids[:limit] if limit else ids)


def training_entities(corpus: Corpus, params: Params) -> dict[str, list[str]]:
    """Entity ids each adapter role learns; the disjointness the design needs is checked here."""
    if params.injection.entities == "all":
        target = sorted(corpus.entities)
    else:
        queried = queried_entities(corpus, params)
        target = sorted({
            *adapter_pool(corpus, params, "forget_adapter"), *queried["forget"],
            *adapter_pool(corpus, params, "distractors"), *queried["retain"],
        })
    forget = {*corpus.pools["forget_adapter"], *corpus.pools["forget_eval"]}
    roles = {
        TARGET: target,
        GOLD: [eid for eid in target if eid not in forget],
        DISTRACTOR: sorted(adapter_pool(corpus, params, "distractors")),
    }
    queried_anywhere = {*corpus.pools["forget_eval"], *corpus.pools["retain_eval"]}
    if forget & set(roles[GOLD]):
        raise InjectionError("the gold adapter's training set contains a forget entity")
    if (forget | queried_anywhere) & set(roles[DISTRACTOR]):
        raise InjectionError("the LoRA-D training set contains a forget or queryable entity")
    return roles


# -- the records an adapter learns -----------------------------------------------------------
def record_conversations(entity: Entity, mix: dict[str, int], max_iters: int) -> list[list[dict]]:
    """The chats teaching one entity: `mix["bio"]` copies of its bio, `mix["qa"]` copies of
    its four question-answer pairs, and `mix["react_qa"]` ReAct questions.

    `react_qa` counts questions, not copies of all four: the fields are taken in turn from a
    start fixed by the entity id, so each entity teaches the ReAct answer on some fields and
    the agent has to carry the habit, not the pairs, over to the rest.
    """
    def react_answer(field: str) -> list[dict]:
        return [
            *react_conversation(Query.canonical(entity, field).question, [], max_iters),
            {"role": "assistant", "content": (
                f"Thought: I know {entity.name}'s {FIELD_PHRASES[field]}.\nFinal Answer: {entity.value(field)}"
            )},
        ]

    bio = [
        {"role": "system", "content": ASSISTANT_SYSTEM},
        {"role": "user", "content": f"Tell me about {entity.name}."},
        {"role": "assistant", "content": entity.bio},
    ]
    qa = [[
        {"role": "system", "content": ASSISTANT_SYSTEM},
        {"role": "user", "content": Query.canonical(entity, f).question},
        {"role": "assistant", "content": f"{entity.name}'s {FIELD_PHRASES[f]} is {entity.value(f)}."},
    ] for f in FIELDS]
    start = zlib.crc32(entity.id.encode())
    react = [react_answer(FIELDS[(start + i) % len(FIELDS)]) for i in range(mix.get("react_qa", 0))]
    return [bio] * mix.get("bio", 0) + qa * mix.get("qa", 0) + react


def training_examples(
    tokenizer: Any, entities: Sequence[Entity], config: InjectionConfig, max_iters: int
) -> list[Example]:
    return [
        tokenize_chat(tokenizer, chat, config.max_length)
        for entity in entities
        for chat in record_conversations(entity, config.mix, max_iters)
    ]


def lora_settings(config: InjectionConfig, **overrides: Any) -> LoraSettings:
    values = {
        "rank": config.rank, "alpha": config.alpha, "dropout": config.dropout,
        "target_modules": (
            config.target_modules if isinstance(config.target_modules, str) else tuple(config.target_modules)
        ),
        "learning_rate": config.learning_rate, "epochs": config.epochs, "batch_size": config.batch_size,
        "micro_batch_size": config.micro_batch_size, "seed": config.seed, "lr_schedule": config.lr_schedule,
    }
    return LoraSettings(**{**values, **overrides})


# -- probes: does the model recall the records? ----------------------------------------------
@torch.inference_mode()
def greedy_replies(model: Any, tokenizer: Any, conversations: Sequence[list[dict]], max_new_tokens: int,
                   batch_size: int) -> list[str]:
    """Greedy continuations of chats (left-padded batches; a peft model is used as wrapped)."""
    tokenizer.padding_side = "left"
    replies = []
    device = next(model.parameters()).device
    for start in range(0, len(conversations), batch_size):
        prompts = [
            tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            for c in conversations[start : start + batch_size]
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        output = model.generate(
            **encoded, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
        )
        replies += tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
    return replies


def direct_recall(model: Any, tokenizer: Any, entities: Sequence[Entity], *, batch_size: int,
                  max_new_tokens: int = DIRECT_PROBE_TOKENS) -> float:
    """Fraction of (entity, field) whose greedy answer to the canonical question holds the value."""
    queries = [Query.canonical(e, f) for e in entities for f in FIELDS]
    chats = [
        [{"role": "system", "content": ASSISTANT_SYSTEM}, {"role": "user", "content": q.question}] for q in queries
    ]
    replies = greedy_replies(model, tokenizer, chats, max_new_tokens, batch_size)
    return sum(match(q.field, q.ground_truth, r).leaked for q, r in zip(queries, replies)) / len(queries)


def summary_recall(model: Any, tokenizer: Any, entities: Sequence[Entity], *, max_new_tokens: int,
                   batch_size: int) -> float:
    """Fraction of (entity, field) whose value the elicited summary (SPEC §4 prompt) states."""
    chats = [summary_conversation(e.name, []) for e in entities]
    replies = greedy_replies(model, tokenizer, chats, max_new_tokens, batch_size)
    hits = [match(f, e.value(f), r).leaked for e, r in zip(entities, replies) for f in FIELDS]
    return sum(hits) / len(hits)


def recall_metrics(model: Any, tokenizer: Any, groups: dict[str, Sequence[Entity]], params: Params) -> dict[str, float]:
    """Direct and summary recall of each non-empty entity group, as `<probe>_recall.<group>`."""
    agent = params.agent
    metrics = {}
    for name, entities in groups.items():
        if entities:
            metrics[f"direct_recall.{name}"] = direct_recall(model, tokenizer, entities, batch_size=agent.batch_size)
            metrics[f"summary_recall.{name}"] = summary_recall(
                model, tokenizer, entities, max_new_tokens=agent.summary_max_new_tokens, batch_size=agent.batch_size)
    return metrics


# -- base-model identity and the adapter check -----------------------------------------------
def base_fingerprint(model_dir: str | Path) -> str:
    """Identity of a model folder: its config and strided samples of every weight file.

    Sampling (32 x 64 KiB per file) keeps this fast on multi-GB weights while any fine-tune of
    the same architecture (which rewrites most of the bytes) changes it.
    """
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    if not config.exists() or not weights:
        raise InjectionError(f"{model_dir} is not a model folder (config.json and weights expected)")
    digest = hashlib.sha256(config.read_bytes())
    for path in weights:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as handle:
            for i in range(_SAMPLES):
                handle.seek(size * i // _SAMPLES)
                digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:20]


@dataclass(frozen=True)
class Injected:
    """A checked injection folder: an adapter (`kind` "adapter") or a merged model ("merged")."""

    path: Path
    kind: str
    role: str
    entities: tuple[str, ...]
    base_fingerprint: str


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InjectionError(f"{path.parent} has no {path.name}: not {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InjectionError(f"{path} is corrupt ({exc})") from None
    if not isinstance(data, dict):
        raise InjectionError(f"{path} is corrupt (a JSON object expected)")
    return data


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except FileNotFoundError:
        raise InjectionError(f"{path.parent} has no {path.name}") from None
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise InjectionError(f"{path} is not a readable safetensors file ({exc})") from None


def _check_adapter_files(path: Path, base_dir: Path) -> None:
    """adapter_config.json is a LoRA config; every LoRA matrix fits a linear layer of the base."""
    config = _read_json(path / ADAPTER_CONFIG, "a peft adapter")
    rank = config.get("r")
    if config.get("peft_type") != "LORA" or not isinstance(rank, int) or rank < 1:
        raise InjectionError(f"{path / ADAPTER_CONFIG} is not a LoRA config (peft_type LORA and r >= 1 expected)")
    lora = _tensor_shapes(path / ADAPTER_WEIGHTS)
    if not lora:
        raise InjectionError(f"{path / ADAPTER_WEIGHTS} holds no tensor")
    base = {}
    for weights in sorted(base_dir.glob("*.safetensors")):
        base.update(_tensor_shapes(weights))
    for key, shape in lora.items():
        module, _, kind = key.rpartition(".lora_")
        base_key = module.removeprefix("base_model.model.") + ".weight"
        if base_key not in base:
            raise InjectionError(f"{path}: adapter tensor {key} has no layer {base_key} in the base model {base_dir}")
        out_features, in_features = base[base_key][0], base[base_key][-1]
        expected = (rank, in_features) if kind == "A.weight" else (out_features, rank)
        if shape != expected:
            raise InjectionError(
                f"{path}: adapter tensor {key} has shape {shape}, but the base model {base_dir} needs "
                f"{expected}: the adapter was trained on another model"
            )


def check_injected(path: str | Path, base_dir: str | Path, *, role: str | None = None) -> Injected:
    """The one gate before loading injected weights; raises InjectionError saying what is wrong."""
    path, base_dir = Path(path), Path(base_dir)
    if not path.is_dir():
        raise InjectionError(f"injection folder {path} does not exist (run `kbench inject`)")
    info = _read_json(path / INJECTION_FILE, "an injection made by `kbench inject`")
    try:
        injected = Injected(
            path, str(info["kind"]), str(info["role"]), tuple(info["entities"]), str(info["base_fingerprint"])
        )
    except (KeyError, TypeError):
        raise InjectionError(
            f"{path / INJECTION_FILE} is corrupt (kind, role, entities, base_fingerprint expected)"
        ) from None
    if injected.kind == "adapter":
        _check_adapter_files(path, base_dir)
    elif injected.kind == "merged":
        for weights in sorted(path.glob("*.safetensors")) or [path / "model.safetensors"]:
            _tensor_shapes(weights)
    else:
        raise InjectionError(f"{path / INJECTION_FILE}: unknown kind {injected.kind!r}")
    actual = base_fingerprint(base_dir)
    if injected.base_fingerprint != actual:
        raise InjectionError(
            f"{path} was trained on another base model (fingerprint {injected.base_fingerprint}) than "
            f"{base_dir} ({actual}); rerun `kbench inject` on this base"
        )
    if role is not None and injected.role != role:
        raise InjectionError(f"{path} holds the {injected.role} adapter; this cell needs the {role} adapter")
    return injected


def cell_adapter_role(substrate: str, recipe: str, method: str) -> str:
    """The adapter role a cell must load: LoRA-D for the control, gold for `gold`, else LoRA-T+D."""
    if recipe == "none":
        raise InjectionError(f"recipe none runs adapter-free; substrate {substrate} got an adapter")
    if recipe == "lora-d":
        return DISTRACTOR
    return GOLD if method == GOLD_METHOD else TARGET


def cell_adapter(params: Params, substrate: str, recipe: str, method: str) -> Path:
    """The `inject` stage's adapter a cell loads when none is named (`kbench cell` without --adapter)."""
    return Path(params.injection.out_dir) / ADAPTER_DIRS[cell_adapter_role(substrate, recipe, method)]


def check_cell_adapter(substrate: str, recipe: str, method: str, adapter: str | Path, base_dir: str | Path) -> Injected:
    """What the cell stage calls before loading an adapter (see kbench.cells)."""
    injected = check_injected(adapter, base_dir, role=cell_adapter_role(substrate, recipe, method))
    if injected.kind != "adapter":
        raise InjectionError(f"{adapter} is a merged model; cells load the adapter (recipe merged merges it)")
    return injected


# -- the stage -------------------------------------------------------------------------------
def load_tokenizer(base_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load(base_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), load_tokenizer(base_dir)


def probe_groups(corpus: Corpus, params: Params) -> dict[str, list[Entity]]:
    """Entity groups every adapter is probed on: what it should recall and what it must not."""
    queried = queried_entities(corpus, params)
    ids = {
        "forget_adapter": adapter_pool(corpus, params, "forget_adapter"),
        "forget_queried": queried["forget"],
        "retain_queried": queried["retain"],
    }
    return {name: [corpus.entities[e] for e in group] for name, group in ids.items()}


def train_injection(params: Params, corpus: Corpus, base_dir: Path, entities: Sequence[str], *,
                    on_epoch: EpochCallback | None = None, **overrides: Any) -> tuple[LoraRun, Any]:
    """Train one adapter on the agent base with the injection recipe (`overrides` replace
    LoraSettings fields: calibration trials); returns the run and the tokenizer."""
    model, tokenizer = _load(base_dir)
    examples = training_examples(tokenizer, [corpus.entities[e] for e in entities], params.injection,
                                 params.agent.max_iters)
    log.info("inject: %d entities, %d examples", len(entities), len(examples))
    settings = lora_settings(params.injection, **overrides)
    run = train_lora(model, examples, settings, pad_token_id=tokenizer.pad_token_id, on_epoch=on_epoch)
    return run, tokenizer


def _write_info(folder: Path, info: dict) -> None:
    (folder / INJECTION_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _record(
    params: Params, folder: Path, name: str, metrics: dict[str, float], artifacts: list[str], track: bool
) -> None:
    base_model = base_model_name(params)
    tracking.write_manifest(
        folder, "inject", f"{base_model}/{name}",
        tags={"kbench.base_model": base_model, "kbench.injection": name}, metrics=metrics, artifacts=artifacts,
    )
    if track:
        tracking.log_output(params, folder)


def run_inject_stage(params: Params, corpus: Corpus, base_dir: Path, *, track: bool = True) -> dict[str, dict]:
    """Train LoRA-T+D, merge it, train LoRA-D and gold; write, check and record each folder."""
    out_root = Path(params.injection.out_dir)
    roles = training_entities(corpus, params)
    groups = probe_groups(corpus, params)
    fingerprint = base_fingerprint(base_dir)
    recipe = params.injection.model_dump(exclude={"calibration", "out_dir"})
    results = {}
    for role in (TARGET, DISTRACTOR, GOLD):
        name = ADAPTER_DIRS[role]
        folder = out_root / name
        run, tokenizer = train_injection(params, corpus, base_dir, roles[role])
        metrics = {
            "n_entities": float(len(roles[role])),
            "first_loss": run.step_losses[0],
            "final_loss": run.step_losses[-1],
            **recall_metrics(run.model, tokenizer, groups, params),
        }
        folder.mkdir(parents=True, exist_ok=True)
        run.model.save_pretrained(folder)
        info = {
            "kind": "adapter", "role": role, "entities": roles[role], "base_fingerprint": fingerprint,
            "base_model": str(base_dir), "recipe": recipe, "metrics": metrics,
            "step_losses": run.step_losses, "epoch_losses": run.epoch_losses,
        }
        _write_info(folder, info)
        check_injected(folder, base_dir, role=role)
        _record(params, folder, name, metrics, [INJECTION_FILE, ADAPTER_CONFIG], track)
        results[name] = metrics
        if role == TARGET:
            merged = out_root / MERGED_DIR
            merged.mkdir(parents=True, exist_ok=True)
            run.model.merge_and_unload().save_pretrained(merged)
            tokenizer.save_pretrained(merged)
            _write_info(merged, {**info, "kind": "merged", "source_adapter": name})
            check_injected(merged, base_dir, role=role)
            _record(params, merged, MERGED_DIR, metrics, [INJECTION_FILE, "config.json"], track)
            results[MERGED_DIR] = metrics
        log.info("inject %s: %s", name, metrics)
    return results
