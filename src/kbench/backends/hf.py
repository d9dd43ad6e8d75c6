"""`hf`: a local transformers causal LM, any HF folder (SmolLM2-135M on CPU, Llama-3.1-8B on GPU).

Decoding is greedy with a KV cache; `generate` keeps only the last position's logits
(`logits_to_keep=1`) on models that support it. Prompts are left-padded so every row's next
token sits in the last column; the attention mask hides the padding and `generate` derives
position ids from it, so a padded row computes the same continuation as the row alone
(checked by tests/test_agent_lockstep.py). The shared system-prompt prefix is not cached
across rows: splicing a cached prefix under left padding shifts positions and breaks the
batched-equals-batch-1 guarantee, and for the default model prefill is a small part of a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from kbench.backends.base import (
    Backend,
    BackendError,
    Conversation,
    Generation,
    register_backend,
    truncate_at_stop,
)
from kbench.config import ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: End-of-turn markers of common chat templates (ChatML, Llama 3, Mistral, Gemma).
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@register_backend("hf")
class HFBackend(Backend):
    has_weights = True

    def __init__(self, config: ModelConfig) -> None:
        self.device = resolve_device(config.device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.path)
            model = AutoModelForCausalLM.from_pretrained(config.path, dtype=_DTYPES[config.dtype])
        except OSError as exc:
            raise BackendError(f"cannot load an HF causal LM from {config.path!r}: {exc}") from None
        if tokenizer.chat_template is None:
            raise BackendError(f"the tokenizer in {config.path!r} has no chat template")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer = tokenizer
        self._model = model.to(self.device).eval()
        self._end_of_turn_ids = self._find_end_of_turn_ids()

    def _find_end_of_turn_ids(self) -> list[int]:
        ids = set()
        configured = self._model.generation_config.eos_token_id
        if configured is not None:
            ids.update([configured] if isinstance(configured, int) else configured)
        if self._tokenizer.eos_token_id is not None:
            ids.add(self._tokenizer.eos_token_id)
        vocab = self._tokenizer.get_vocab()
        ids.update(vocab[marker] for marker in _END_OF_TURN if marker in vocab)
        return sorted(ids)

    @property
    def model(self) -> Any:
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def render(self, conversation: Conversation) -> str:
        """The prompt text: the chat template with the assistant turn opened."""
        return self._tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )

    def load_adapter(self, path: str, *, merge: bool = False) -> None:
        from peft import PeftModel

        try:
            wrapped = PeftModel.from_pretrained(self._model, path)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load the LoRA adapter at {path!r}: {exc}") from None
        self._model = (wrapped.merge_and_unload() if merge else wrapped).eval()

    @torch.inference_mode()
    def generate(
        self, conversations: Sequence[Conversation], *, stop: Sequence[str], max_new_tokens: int
    ) -> list[Generation]:
        if not conversations:
            return []
        prompts = [self.render(c) for c in conversations]
        encoded = self._tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=self._end_of_turn_ids,
            pad_token_id=self._tokenizer.pad_token_id,
            stop_strings=list(stop) or None,
            use_cache=True,
        )
        output = self._model.generate(**encoded, generation_config=config, tokenizer=self._tokenizer)
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        texts = self._tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [Generation(truncate_at_stop(text, stop)) for text in texts]
