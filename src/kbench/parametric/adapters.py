"""Substrate P's adapter folders and the check every one passes before a cell loads it.

Four outputs under `injection.out_dir` (docs/parametric.md), written by the `inject` stage
(`kbench.stages.inject`):

    lora_td/    LoRA-T+D: a LoRA adapter on the agent base, fine-tuned on the records (bios and
                question-answer pairs) of the targets and the distractors
    merged_td/  the same adapter merged into the base weights (a full model folder)
    lora_d/     LoRA-D: the same recipe on the distractors alone, never on a target (the
                degeneration control loaded with C, R-text and R-struct)
    gold/       the same recipe on the retain entities alone, never on a forget entity (the
                retain-only reference, scored as method `gold` on P)

Every adapter folder carries `injection.json`: its role, the entities it learned, a
fingerprint of the base model it was trained on, the recipe and its training metrics.
`check_injected` reads it with the peft files and refuses a folder that is corrupt, was
trained on another base, or does not fit the cell (a gold cell must load the gold adapter, a
LoRA-D control the distractor adapter).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from kbench import io
from kbench.backends import backend_is_remote
from kbench.config import ModelConfig, Params
from kbench.names import ADAPTER_FREE, CONTROL, GOLD_METHOD, HF_BACKEND

INJECTION_FILE = "injection.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Adapter roles and their folders under injection.out_dir.
TARGET, DISTRACTOR, GOLD = "target", "distractor", GOLD_METHOD
ADAPTER_DIRS = {TARGET: "lora_td", DISTRACTOR: "lora_d", GOLD: GOLD_METHOD}
MERGED_DIR = "merged_td"
#: What an injection folder holds: a peft adapter or a full merged model.
ADAPTER_KIND, MERGED_KIND = "adapter", "merged"
#: Bytes read at evenly spaced offsets of each weight file for the base-model fingerprint.
_SAMPLE_BYTES, _SAMPLES = 1 << 16, 32


class InjectionError(ValueError):
    """An adapter or merged model is missing, corrupt, trained on another base, or the wrong role."""


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
    """A checked injection folder: an adapter (`kind` ADAPTER_KIND) or a merged model (MERGED_KIND)."""

    path: Path
    kind: str
    role: str
    entities: tuple[str, ...]
    base_fingerprint: str



def model_fingerprint(model: ModelConfig) -> str:
    """Identity of the weights a cell's agent runs on (before any injection): the fingerprint
    of the model folder for a local backend, the served model's name for an endpoint."""
    if model.backend == HF_BACKEND or (not backend_is_remote(model.backend) and Path(model.path).is_dir()):
        return base_fingerprint(model.path)
    return f"{model.backend}:{model.name}"

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
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except FileNotFoundError:
        raise InjectionError(f"{path.parent} has no {path.name}") from None
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise InjectionError(f"{path} is not a readable safetensors file ({exc})") from None


def settle_adapter_config(folder: Path) -> None:
    """Rewrite peft's adapter_config.json with `target_modules` sorted: peft keeps them in a set,
    whose order changes from one process to the next, and the same adapter must give the same bytes."""
    config = _read_json(folder / ADAPTER_CONFIG, "a peft adapter")
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    io.write_json(folder / ADAPTER_CONFIG, config)


def _check_finite(path: Path) -> None:
    """Every tensor of a weight file is finite (a NaN or inf weight silently degenerates the agent)."""
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            if not torch.isfinite(handle.get_tensor(key)).all():
                raise InjectionError(f"{path}: tensor {key} holds NaN or infinite weights; rerun `kbench inject`")


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
    if injected.kind == ADAPTER_KIND:
        _check_adapter_files(path, base_dir)
    elif injected.kind == MERGED_KIND:
        for weights in sorted(path.glob("*.safetensors")) or [path / "model.safetensors"]:
            _tensor_shapes(weights)
    else:
        raise InjectionError(f"{path / INJECTION_FILE}: unknown kind {injected.kind!r}")
    io.verify_hashes(path, "folder written by `kbench inject`")
    for weights in sorted(path.glob("*.safetensors")):
        _check_finite(weights)
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
    if recipe == ADAPTER_FREE:
        raise InjectionError(f"recipe none runs adapter-free; substrate {substrate} got an adapter")
    if recipe == CONTROL:
        return DISTRACTOR
    return GOLD if method == GOLD_METHOD else TARGET


def cell_adapter(params: Params, substrate: str, recipe: str, method: str) -> Path:
    """The `inject` stage's adapter a cell loads when none is named (`kbench cell` without --adapter)."""
    return Path(params.injection.out_dir) / ADAPTER_DIRS[cell_adapter_role(substrate, recipe, method)]


def check_cell_adapter(substrate: str, recipe: str, method: str, adapter: str | Path, base_dir: str | Path) -> Injected:
    """What the cell stage calls before loading an adapter (see kbench.stages.cell)."""
    injected = check_injected(adapter, base_dir, role=cell_adapter_role(substrate, recipe, method))
    if injected.kind != ADAPTER_KIND:
        raise InjectionError(f"{adapter} is a merged model; cells load the adapter (recipe merged merges it)")
    return injected


