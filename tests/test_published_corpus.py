"""The published K-Bench v1 corpus end to end: `corpus.source: ../shared/data/kbench-v1`, then a
C cell and an R-struct cell on the real default model (tiny n, short generations)."""

from __future__ import annotations

import json
import logging

import mlflow
import pytest

from kbench.config import Params, parse_params
from kbench.corpus import FORGET_EVAL, QUERIES_FILE, RETAIN_EVAL, load_corpus
from kbench.names import BASELINE_METHOD, CONTEXT, STRUCT_RETRIEVAL
from kbench.records import FORGET, RETAIN, iter_traces
from kbench.stages.cell import METRICS_FILE, TRACES_FILE, CellSpec, run_cell_stage
from kbench.stages.corpus import run_corpus_stage
from kbench import tracking

from conftest import KBENCH_V1

#: Queries per split and cell: both splits are scored, and 2 CPU cores stay within budget.
N_PER_SPLIT = 1


@pytest.fixture
def v1_params(default_model) -> Params:
    """The default params with the published corpus, the raw default model (no agent base) and
    short trajectories: the model runs every trajectory to the cap, which bounds the time."""
    return parse_params({
        "corpus": {"source": str(KBENCH_V1)},
        "queries": {"n_per_split": N_PER_SPLIT, "forms": []},
        "substrates": [CONTEXT, STRUCT_RETRIEVAL],
        "methods": [BASELINE_METHOD],
        "model": {"path": str(default_model), "device": "cpu"},
        "agent": {"max_iters": 2, "max_new_tokens": 32, "summary_max_new_tokens": 16, "batch_size": 2},
        "agent_base": {"enabled": False},
    })


@pytest.mark.slow
def test_kbench_v1_runs_a_c_and_an_r_struct_cell_end_to_end(kbench_root, v1_params, caplog):
    corpus_dir = kbench_root / "artifacts/corpus"
    with caplog.at_level(logging.WARNING, logger="kbench.stages.corpus"):
        corpus = run_corpus_stage(v1_params, corpus_dir)
    # A folder outside data/ runs, and the stage says that DVC does not watch it.
    assert any(str(KBENCH_V1) in r.getMessage() and "outside data/" in r.getMessage() for r in caplog.records)
    assert json.loads((corpus_dir / "manifest.json").read_text())["source"] == str(KBENCH_V1)
    assert load_corpus(corpus_dir).fingerprint() == load_corpus(KBENCH_V1).fingerprint() == corpus.fingerprint()
    published = {
        row["query_id"]: row
        for row in map(json.loads, (KBENCH_V1 / QUERIES_FILE).read_text().splitlines())
    }

    for substrate in (CONTEXT, STRUCT_RETRIEVAL):
        spec = CellSpec(substrate, BASELINE_METHOD, seed=0)
        out = run_cell_stage(v1_params, spec, corpus_dir=corpus_dir, index_dir=None,
                             out_root=kbench_root / "artifacts/cells")
        records = list(iter_traces(out / TRACES_FILE))
        assert sorted(r.split for r in records) == [FORGET] * N_PER_SPLIT + [RETAIN] * N_PER_SPLIT
        for record in records:
            # Every query is one of the published ones, asked about an entity of its eval pool.
            row = published[record.query_id]
            assert (record.field, record.ground_truth) == (row["field"], row["ground_truth"])
            assert corpus.query(record.query_id).question == row["query"]
            pool = FORGET_EVAL if record.split == FORGET else RETAIN_EVAL
            assert record.entity_id in corpus.pools[pool]
            assert record.substrate == substrate and record.steps
        metrics = json.loads((out / METRICS_FILE).read_text())
        assert {split: metrics[split]["n"] for split in (FORGET, RETAIN)} == {FORGET: N_PER_SPLIT, RETAIN: N_PER_SPLIT}
        assert all(0.0 <= metrics[split]["or_all"] <= 1.0 for split in (FORGET, RETAIN))

    # The MLflow store holds the corpus run and both cells, tagged with the published corpus.
    experiment_id = tracking.open_experiment(v1_params)
    runs = mlflow.search_runs(experiment_ids=[experiment_id], output_format="list")
    by_kind = {}
    for run in runs:
        by_kind.setdefault(run.data.tags[tracking.TAG_KIND], []).append(run)
    assert by_kind[tracking.KIND_CORPUS][0].data.tags[tracking.TAG_CORPUS_SOURCE] == str(KBENCH_V1)
    cells = by_kind[tracking.KIND_CELL]
    assert sorted(r.data.tags[tracking.TAG_SUBSTRATE] for r in cells) == sorted([CONTEXT, STRUCT_RETRIEVAL])
    assert {r.data.tags[tracking.TAG_CORPUS] for r in cells} == {corpus.fingerprint()}
