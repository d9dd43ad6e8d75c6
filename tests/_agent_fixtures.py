"""Shared fixtures of the agent tests: a small corpus, a tiny random-weight chat model, a scripted backend."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from kbench.backends import Backend, Conversation, Generation, Request
from kbench.config import CorpusConfig, Params
from kbench.corpus import Corpus, generate_corpus

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def small_corpus() -> Corpus:
    return generate_corpus(CorpusConfig(n_entities=120))


@pytest.fixture(scope="session")
def params() -> Params:
    return Params()


def copy_tokenizer(source: Path, out: Path, *extra: str) -> Path:
    """The tokenizer files (and chat template) of the model folder `source`, plus the files named
    in `extra`, copied into `out`: a random-weight model of another config is saved beside them."""
    for path in source.iterdir():
        if "token" in path.name or path.name == "chat_template.jinja" or path.name in extra:
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random-weight Llama with a byte-level BPE tokenizer and a ChatML template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny-llama")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    raw = Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    text = ["Thought: Action: search_wiki[ lookup_record[ verify_attribute[ Final Answer: Observation: "
            "What is the date of birth home address occupation employer of a person?"] * 20
    raw.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


class ScriptedBackend(Backend):
    """Replies from a script keyed by how many assistant turns the conversation already has."""

    name = "scripted"
    has_weights = False

    def __init__(self, replies: Sequence[str], summary: str = "A summary.") -> None:
        self.replies = list(replies)
        self.summary = summary
        self.calls: list[int] = []

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        self.calls.append(len(conversations))
        out = []
        for conversation in conversations:
            if not request.stop:  # the summary prompt
                out.append(Generation(self.summary))
                continue
            turn = sum(m["role"] == "assistant" for m in conversation)
            out.append(Generation(self.replies[min(turn, len(self.replies) - 1)]))
        return out


@pytest.fixture(scope="session")
def index_dir(small_corpus, tmp_path_factory) -> Path:
    """The R-text index of `small_corpus`, built once per test session."""
    from kbench.substrates import build_index, index_entities

    return build_index(index_entities(small_corpus), tmp_path_factory.mktemp("index"))
