"""`hf`: a local transformers causal LM, any HF folder (SmolLM2-135M on CPU, Llama-3.1-8B on GPU).

This module is the project's one HF model loader (`load_model`, honouring `model.dtype` and
`model.device`) and its one greedy decoder (`greedy_decode`, over the KV engine of
`kbench.backends.engine`): the agent's cells, the agent base, the injection recall probes and
calibration all load and decode through them.

The backend decodes with the engine by default (`model.engine: kv`): each trajectory's cache
is kept across its ReAct steps (`Backend.session`) and prompts that start alike share one
prefilled prefix. `model.engine: generate` runs transformers' `generate` on the whole
left-padded prompt at every step instead (`reference_decode`): the harness as it was before
the engine, the reference the engine is checked against (benchmarks/agent_throughput.py).
A model the engine was not built for (`engine_support`: chunked or linear attention layers,
say) decodes with `generate` whatever `model.engine` says, after one log line.
Either way a padded row computes what the row alone would (tests/test_agent_lockstep.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from kbench import io
from kbench.backends.base import (
    Backend,
    BackendError,
    Conversation,
    Generation,
    Request,
    register_backend,
    truncate_at_stop,
)
from kbench.backends.engine import Checkpoint, Engine, KVState, engine_support
from kbench.config import ModelConfig
from kbench.names import GENERATE_ENGINE, HF_BACKEND

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: End-of-turn markers of common chat templates (ChatML, Llama 3, Mistral, Gemma).
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")

log = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_model_folder(path: str | Path) -> Path:
    """`path` if it is a local model folder; BackendError saying what to do otherwise (models are
    never fetched from a hub at run time). A stage-built folder is also checked against its hashes."""
    folder = Path(path)
    if not folder.is_dir():
        raise BackendError(f"model folder {folder} does not exist: run `make setup` for the default model "
                           "(or the stage that builds it), or set model.path to a Hugging Face causal-LM folder")
    if not (folder / "config.json").is_file():
        raise BackendError(f"{folder} is not a model folder (no config.json); set model.path to a Hugging "
                           "Face causal-LM folder")
    if (folder / io.HASHES_FILE).exists():
        io.verify_hashes(folder, "model folder")
    return folder


def load_tokenizer(path: str | Path) -> Any:
    """The folder's tokenizer, with the end-of-sequence token as padding when it has none."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise BackendError(f"cannot load a tokenizer from {str(path)!r}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(config: ModelConfig, path: str | Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of an HF causal-LM folder (`path`, default `config.path`) in
    `config.dtype` on `config.device`; the model is in eval mode."""
    path = check_model_folder(config.path if path is None else path)
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[config.dtype])
    except OSError as exc:
        raise BackendError(f"cannot load an HF causal LM from {str(path)!r}: {exc}") from None
    return model.to(resolve_device(config.device)).eval(), tokenizer


def load_weights(config: ModelConfig, path: str | Path | None = None) -> Any:
    """The model of `load_model` alone: `functools.partial(load_weights, config)` is a picklable
    loader for a process that needs the same weights (`train_lora(loader=)`)."""
    return load_model(config, path)[0]


def engine_reason(path: str | Path) -> str | None:
    """Why the KV engine cannot decode the model folder at `path` (None: it can), read from its
    config alone (the model built on the meta device, no weights loaded)."""
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        return engine_support(AutoModelForCausalLM.from_config(config))


def end_of_turn_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn: the configured EOS ids and known end-of-turn markers."""
    ids = set()
    configured = model.generation_config.eos_token_id
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[marker] for marker in _END_OF_TURN if marker in vocab)
    return sorted(ids)


def render_prompt(tokenizer: Any, conversation: Conversation) -> str:
    """The prompt text: the chat template with the assistant turn opened."""
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, conversation: Conversation) -> list[int]:
    """The prompt's token ids, as a batch of one would tokenize it."""
    return tokenizer(render_prompt(tokenizer, conversation), add_special_tokens=False)["input_ids"]


def greedy_decode(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    batch_size: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
    engine: Engine | None = None,
    states: Sequence[KVState] | None = None,
    share_prefixes: bool = True,
) -> list[str]:
    """Greedy continuations of chats, `batch_size` at a time (default: all in one batch).

    A row ends at an end-of-turn token (`eos_token_ids`, default `end_of_turn_ids`) or at
    the first `stop` string (the text is cut before it). `states` (one per conversation)
    keep each sequence's cache for its next call; `engine` keeps shared prefixes across calls.
    Without either, a model the engine does not support decodes with `reference_decode`.
    """
    if not conversations:
        return []
    size = batch_size or len(conversations)
    texts: list[str] = []
    if engine is None:
        ids = end_of_turn_ids(model, tokenizer) if eos_token_ids is None else eos_token_ids
        reason = engine_support(model) if states is None else None
        if reason is not None:
            log.warning("decoding with transformers' generate, not the KV engine: %s", reason)
            for start in range(0, len(conversations), size):
                texts += reference_decode(model, tokenizer, conversations[start : start + size],
                                          max_new_tokens=max_new_tokens, stop=stop, eos_token_ids=ids)
            return texts
        engine = Engine(model, tokenizer, ids)
    states = [KVState() for _ in conversations] if states is None else states
    prompts = [encode_prompt(tokenizer, c) for c in conversations]
    for start in range(0, len(conversations), size):
        outputs = engine.generate(
            states[start : start + size], prompts[start : start + size],
            max_new_tokens=max_new_tokens, stop=stop, share_prefixes=share_prefixes,
        )
        texts += [truncate_at_stop(tokenizer.decode(o, skip_special_tokens=True), stop) for o in outputs]
    return texts


@torch.inference_mode()
def reference_decode(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    eos_token_ids: Sequence[int],
) -> list[str]:
    """transformers' `generate` on the whole left-padded prompts, with its stop strings: what
    the harness did before the KV engine, kept as the engine's reference (`model.engine: generate`)."""
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_token_ids),
        pad_token_id=tokenizer.pad_token_id,
        stop_strings=list(stop) or None,
        use_cache=True,
    )
    prompts = [render_prompt(tokenizer, c) for c in conversations]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    output = model.generate(**encoded, generation_config=config, tokenizer=tokenizer)
    new_tokens = output[:, encoded["input_ids"].shape[1] :]
    return [truncate_at_stop(t, stop) for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


class EngineSessions:
    """`KVSessions` over a backend's KV engine: `owner.engine` and `owner.tokenizer`, read at each
    call (a loaded adapter gets a new engine). No prefix is shared across sessions."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def open(self) -> KVState:
        return KVState()

    def encode(self, conversation: Conversation) -> list[int]:
        return encode_prompt(self.owner.tokenizer, conversation)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.owner.tokenizer.decode(tokens, skip_special_tokens=True)

    def prefill(self, sessions: Sequence[KVState], prompts: Sequence[Sequence[int]]) -> None:
        self.owner.engine.prefill(sessions, prompts, share_prefixes=False)

    def generate(self, sessions: Sequence[KVState], prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 stop: Sequence[str], choose: Callable[[int, torch.Tensor], int] | None = None) -> list[list[int]]:
        return self.owner.engine.generate(sessions, prompts, max_new_tokens=max_new_tokens, stop=stop,
                                          share_prefixes=False, choose=choose)

    def tokens_fed(self) -> int:
        stats = self.owner.engine.stats
        return stats.prefill_tokens + stats.generated_tokens

    def retained_bytes(self, checkpoints: Sequence[Checkpoint | None], live: Sequence[KVState | None]) -> int:
        # tensors are shared views, so what counts is each storage a checkpoint holds and no live state does
        def storages(layers: Any) -> dict[int, int]:
            found = {}
            for keys, values in layers or ():
                for t in (keys, values):
                    found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return found

        held: dict[int, int] = {}
        for checkpoint in checkpoints:
            if checkpoint is not None:
                held |= storages(checkpoint.layers)
        alive: dict[int, int] = {}
        for state in live:
            if state is not None:
                alive |= storages(state.layers)
        return sum(n for ptr, n in held.items() if ptr not in alive)


@register_backend(HF_BACKEND)
class HFBackend(Backend):
    has_weights = True

    def __init__(self, config: ModelConfig) -> None:
        self.device = resolve_device(config.device)
        model, tokenizer = load_model(config)
        if tokenizer.chat_template is None:
            raise BackendError(f"the tokenizer in {config.path!r} has no chat template")
        tokenizer.padding_side = "left"
        self._path = config.path
        self._tokenizer = tokenizer
        self._model = model
        # Found once: a vocabulary scan per ReAct step would sit on the agent's hot path.
        self._end_of_turn_ids = end_of_turn_ids(model, tokenizer)
        #: Why the KV engine cannot decode this model (None: it can); then `generate` decodes.
        self._unsupported = engine_support(model)
        if self._unsupported is not None and config.engine != GENERATE_ENGINE:
            log.warning("model.engine: kv falls back to generate for %s: %s", config.path, self._unsupported)
        self._reference = config.engine == GENERATE_ENGINE or self._unsupported is not None
        self._engine = None if self._unsupported else Engine(model, tokenizer, self._end_of_turn_ids)

    @property
    def model(self) -> Any:
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def render(self, conversation: Conversation) -> str:
        """The prompt text: the chat template with the assistant turn opened."""
        return render_prompt(self._tokenizer, conversation)

    def load_adapter(self, path: str, *, merge: bool = False) -> None:
        from peft import PeftModel

        try:
            wrapped = PeftModel.from_pretrained(self._model, path)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load the LoRA adapter at {path!r}: {exc}") from None
        self._model = (wrapped.merge_and_unload() if merge else wrapped).eval()
        if self._unsupported is None:
            self._engine = Engine(self._model, self._tokenizer, self._end_of_turn_ids)

    @property
    def batch_rows(self) -> tuple[int, ...] | None:
        """Which conversations of the running `generate` call the rows of the forward pass now
        running are (for a forward hook): indices under the KV engine, () for a shared-prefix
        pass, None under `model.engine: generate` (every row, in order)."""
        return None if self._reference else self._engine.active_rows

    @property
    def engine(self) -> Engine:
        """The KV engine over the current weights (a loaded adapter gets a new one); BackendError
        for a model the engine does not support."""
        if self._engine is None:
            raise BackendError(f"the KV engine cannot decode the model in {self._path!r}: {self._unsupported}")
        return self._engine

    def session(self) -> KVState | None:
        """A fresh KV state for one trajectory (None under `model.engine: generate`)."""
        return None if self._reference else KVState()

    def kv_sessions(self) -> EngineSessions | None:
        """The KV engine's operations on sessions (None under `model.engine: generate`)."""
        return None if self._reference else EngineSessions(self)

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        if self._reference:
            texts = reference_decode(
                self._model, self._tokenizer, conversations, max_new_tokens=request.max_new_tokens,
                stop=request.stop, eos_token_ids=self._end_of_turn_ids,
            )
        else:
            texts = greedy_decode(
                self._model, self._tokenizer, conversations, max_new_tokens=request.max_new_tokens,
                stop=request.stop, engine=self._engine, states=request.sessions,
                share_prefixes=request.share_prefixes,
            )
        return [Generation(text) for text in texts]
