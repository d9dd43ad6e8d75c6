"""End to end: setup_cell + run_cell on a tiny random-weight model (every substrate) and on the real default model."""

import pytest

from _agent_fixtures import index_dir, params, small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from kbench.config import ModelConfig
from kbench.observer.matcher import match
from kbench.records import iter_traces
from kbench.agent.runner import run_cell, setup_cell


@pytest.fixture(scope="module")
def tiny_adapter(tiny_model_dir, tmp_path_factory):  # noqa: F811
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("adapter")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(out)
    return str(out)


def items_of(corpus, n):
    return [(q, "forget") for q in corpus.sample_queries("forget", n, 0)] + [
        (q, "retain") for q in corpus.sample_queries("retain", n, 0)]


@pytest.mark.parametrize("substrate", ["C", "R-text", "R-struct", "P"])
def test_tiny_model_end_to_end(substrate, small_corpus, params, index_dir, tiny_model_dir, tiny_adapter, tmp_path):  # noqa: F811
    small = params.model_copy(update={"agent": params.agent.model_copy(
        update={"max_new_tokens": 8, "summary_max_new_tokens": 8, "batch_size": 3})})
    agent = setup_cell(
        small, small_corpus, ModelConfig(path=str(tiny_model_dir), device="cpu"),
        substrate=substrate, method="none", seed=0, index_dir=index_dir,
        adapter_path=tiny_adapter if substrate == "P" else None,
    )
    items = items_of(small_corpus, 2)
    records = run_cell(agent, items, tmp_path / "traces.jsonl", progress=False)
    assert sorted(r.query_id for r in records) == sorted(q.query_id for q, _ in items)
    assert [r.query_id for r in iter_traces(tmp_path / "traces.jsonl")] == [r.query_id for r in records]
    for record in records:
        assert record.substrate == substrate and record.method == "none"
        assert record.halted_reason in {"final_answer", "parse_error", "max_iters", "tool_fallback"}
        assert record.summary is not None and record.summary_error is None
        assert len(record.steps) >= 1


@pytest.mark.slow
def test_default_model_end_to_end(small_corpus, params, index_dir, tmp_path, default_model):  # noqa: F811
    """n = 3 per split on SmolLM2-135M-Instruct (the agent base if it was built, else the raw model).

    Short trajectories (3 iterations, 64 new tokens): the untuned model runs every trajectory
    to the cap, and the suite must stay within its time budget on 2 cores.
    """
    from kbench.parametric.agent_base import agent_model_config
    from kbench.backends.packaged import is_model_folder

    short = params.agent.model_copy(update={"max_iters": 3, "max_new_tokens": 64, "summary_max_new_tokens": 64})
    params = params.model_copy(update={"agent": short})
    model = agent_model_config(params)
    if not is_model_folder(model.path):
        model = params.model.model_copy(update={"path": str(default_model)})
    agent = setup_cell(params, small_corpus, model, substrate="C", method="none", seed=0, index_dir=index_dir)
    records = run_cell(agent, items_of(small_corpus, 3), tmp_path / "traces.jsonl", progress=False)
    assert len(records) == 6
    assert all(r.summary for r in records)  # the summary prompt always gets an answer
    # On C the bio is in the prompt: the model repeats some target value somewhere.
    assert any(match(r.field, r.ground_truth, r.raw_reply + "\n" + r.summary).leaked for r in records)
