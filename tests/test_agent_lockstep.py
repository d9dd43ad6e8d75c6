"""Greedy lockstep batches give the same traces as one trajectory at a time, on the real default model."""

import pytest

from _agent_fixtures import index_dir, params, small_corpus  # noqa: F401  (fixtures)
from kbench.agent import ReActAgent
from kbench.backends import build_backend
from kbench.methods import MethodContext, build_method
from kbench.substrates import build_substrate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_config(params, default_model):  # noqa: F811
    """The agent base when it was built (multi-step trajectories), else the raw default model."""
    from kbench.parametric.agent_base import agent_model_config
    from kbench.backends.packaged import is_model_folder

    model = agent_model_config(params)
    if not is_model_folder(model.path):
        model = params.model.model_copy(update={"path": str(default_model)})
    return model.model_copy(update={"device": "cpu", "dtype": "float32"})


@pytest.fixture(scope="module")
def backend(model_config):
    return build_backend(model_config)


def traces(backend, substrate, corpus, params, index_dir, items, **agent):
    """The trace records (as dicts, by query id) of `items` on one substrate."""
    config = params.agent.model_copy(update={"max_new_tokens": 32, "summary_max_new_tokens": 16, **agent})
    react = ReActAgent(
        backend, build_substrate(substrate, corpus, config, seed=0, index_dir=index_dir),
        build_method("none", MethodContext(corpus, params, 0)), config, seed=0,
    )
    records = []
    react.run(items, records.append)
    return sorted((r.model_dump() for r in records), key=lambda r: r["query_id"])


@pytest.mark.parametrize("substrate", ["C", "R-text"])
def test_batched_traces_equal_batch_one_traces(substrate, backend, small_corpus, params, index_dir):  # noqa: F811
    # Small on purpose: the untuned model runs every trajectory to the cap, and the suite must
    # stay within its time budget on 2 cores; three rows still exercise padding and drop-out.
    items = [(q, "forget") for q in small_corpus.sample_queries("forget", 3, 1)]
    batched, alone = (traces(backend, substrate, small_corpus, params, index_dir, items, batch_size=size, max_iters=2)
                      for size in (3, 1))
    assert batched == alone


@pytest.mark.parametrize("substrate", ["C", "R-struct"])
def test_kv_engine_traces_equal_the_generate_harness(substrate, backend, model_config, small_corpus, params,
                                                     index_dir):  # noqa: F811
    """The KV engine (cache kept across steps, shared prefixes) against `generate` on whole prompts."""
    reference = build_backend(model_config.model_copy(update={"engine": "generate"}))
    items = [(q, "forget") for q in small_corpus.sample_queries("forget", 3, 2)]
    kv, generate = (traces(b, substrate, small_corpus, params, index_dir, items, batch_size=3, max_iters=3)
                    for b in (backend, reference))
    assert kv == generate
