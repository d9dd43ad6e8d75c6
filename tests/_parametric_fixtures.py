"""Fixtures of the substrate-P tests: a tiny Llama that can memorize, a small corpus, fast params."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)

from kbench.config import CorpusConfig, Params, parse_params
from kbench.corpus import Corpus, generate_corpus


def save_tiny_llama(tokenizer_dir: Path, out: Path, *, seed: int, hidden_size: int = 64) -> Path:
    """A random 2-layer Llama beside the tiny tokenizer. initializer_range 0.3 (not 0.02): at
    0.02 the frozen output head caps every logit near 0.6, and no LoRA could make the model
    confident enough to reproduce a record."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
        max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run far faster on one thread, above all on a shared, busy CPU (module scope:
    it must be in force before the module's fixtures train anything)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def learner_dir(tiny_model_dir, tmp_path_factory) -> Path:  # noqa: F811
    return save_tiny_llama(tiny_model_dir, tmp_path_factory.mktemp("learner"), seed=0)


@pytest.fixture(scope="session")
def p_corpus() -> Corpus:
    """40 entities: forget adapter 2, forget eval 6, retain adapter (distractors) 2, retain eval 30."""
    return generate_corpus(CorpusConfig(n_entities=40))


#: injection keys of fast_params that belong to its `lora` section.
_LORA_KEYS = {"rank", "alpha", "epochs", "learning_rate", "batch_size", "micro_batch_size", "seed", "lr_schedule"}


def fast_params(tmp: Path, **injection) -> Params:
    """CPU-test params: 2 queries per split, short generations, a strong LoRA on qa records only."""
    lora = {k: injection.pop(k) for k in list(injection) if k in _LORA_KEYS}
    return parse_params({
        "queries": {"n_per_split": 2},
        "agent": {"max_new_tokens": 24, "summary_max_new_tokens": 24, "max_iters": 2, "batch_size": 16},
        "agent_base": {"enabled": False},
        "tracking": {"experiment": "test"},
        "injection": {
            "out_dir": str(tmp / "adapters"), "mix": {"qa": 1}, "adapter_pool_entities": 1,
            "lora": {"rank": 8, "alpha": 16, "epochs": 3, "learning_rate": 1e-2, "batch_size": 8,
                     "micro_batch_size": 8, **lora},
            **injection,
        },
    })


def trained_p_design(tmp: Path, corpus: Corpus, model_dir: Path) -> Params:
    """fast_params with none, gold and ga on recipe lora over `model_dir`, their adapters
    (LoRA-T+D, gold, LoRA-D, ga's) trained in-process and the corpus written to tmp/corpus."""
    from kbench.config import UnlearningConfig
    from kbench.corpus import write_corpus
    from kbench.stages import inject as inject_stage
    from kbench.stages import unlearn as unlearn_stage

    base = fast_params(tmp)
    params = base.model_copy(update={
        "methods": ["none", "gold", "ga"], "p_recipes": ["lora"],
        "queries": base.queries.model_copy(update={"forms": []}),
        "unlearning": UnlearningConfig(out_dir=str(tmp / "unlearned"), epochs=1, batch_size=4, learning_rate=1e-2),
        "model": base.model.model_copy(update={"path": str(model_dir)}),
    })
    inject_stage.run_inject_stage(params, corpus, model_dir, track=False)
    unlearn_stage.run_unlearn_stage(params, corpus, track=False)
    write_corpus(corpus, tmp / "corpus")
    return params
