"""The memory lane's stages: instances written from the corpus, each system's items, scores
and traces (resumed instance by instance), the results page, and bad input named in one line."""

from __future__ import annotations

import json

import pytest

from kbench.comparison.analysis import compare
from kbench.comparison.report import Provenance
from kbench.config import Params
from kbench.memory.instances import read_instances
from kbench.memory.records import read_items
from kbench.stages.compare import lane_scores, write_reports

from _agent_fixtures import small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from test_stage_unit import assert_corrupt_inputs_start_over
from test_memory_systems import EchoBackend

SYSTEMS = ["full-context", "fact-store", "reference"]


@pytest.fixture
def lane(kbench_root, small_corpus, tiny_model_dir, monkeypatch):  # noqa: F811
    import kbench.stages.memory as stage
    from kbench.corpus import write_corpus

    corpus_dir = kbench_root / "corpus"
    write_corpus(small_corpus, corpus_dir)
    params = Params.model_validate({"agent_base": {"out_dir": str(tiny_model_dir)}, "execution": {"cell_workers": 1},
                                    "memory": {"systems": SYSTEMS, "per_tier": {"short": 2}, "resamples": 50}})
    monkeypatch.setattr(stage, "worker_backend", lambda model: EchoBackend())
    return params, corpus_dir


def test_the_lane_writes_instances_items_scores_traces_and_a_page(lane, kbench_root, monkeypatch, caplog):
    import mlflow

    import kbench.stages.memory as stage
    from kbench.stages import memory_instances, memory_report

    params, corpus_dir = lane
    assert memory_instances.main(params, memory_instances.Options(corpus=corpus_dir)) == 0
    instances = read_instances(kbench_root / "artifacts/memory-instances.jsonl")
    assert [i.tier for i in instances] == ["short", "short"]
    assert stage.main(params, stage.Options()) == 0
    for system in SYSTEMS:
        out = kbench_root / "artifacts/memory" / system
        items = read_items([out / "items.jsonl"])
        assert len(items) == sum(len(i.probes) for i in instances) and {i.system for i in items} == {system}
        scores = json.loads((out / "scores.json").read_text())
        assert scores["instances"] == 2 and scores["failures"] == 0 and scores["bootstrap"]["resamples"] == 50
        info = json.loads((out / "instances.json").read_text())
        assert list(info) == [i.instance_id for i in instances] and set(info[instances[0].instance_id]["memories"]) == {
            "control", "forget"}
        traces = [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]
        assert [t["answer"] for t in traces] == [i.reply for i in items] and set(scores["channels"]) == {"control", "forget"}
    reference = json.loads((kbench_root / "artifacts/memory/reference/scores.json").read_text())
    full = json.loads((kbench_root / "artifacts/memory/full-context/scores.json").read_text())
    assert reference["PR"] == 1.0 and reference["FE"] > full["FE"]
    assert memory_report.main(params, memory_report.Options()) == 0
    page = (kbench_root / "docs/results-memory.md").read_text()
    assert "| reference | 2 |" in page and "### Forget efficacy by request type" in page and "FE vs PR" in page
    assert "### Where the fact sits, by channel" in page and "| reference | forget |" in page
    # The report's memory section reads the same scores; the execution-state lane has not run here.
    lanes = lane_scores(params)
    assert list(lanes.memory) == SYSTEMS and lanes.memory["reference"] == reference and lanes.replay == {}
    write_reports(compare([], params.scoring), kbench_root / "reports", Provenance("kbench", "sqlite://", 0, "abc"),
                  None, lanes)
    html = (kbench_root / "reports/index.html").read_text()
    memory_section = html.split('<h2 id="memory">')[1]
    assert "<td>reference</td><td>2</td>" in memory_section and "Attack resistance by attack" in memory_section
    assert 'alt="forget efficacy against preservation per memory system" src="data:image/png;base64,' in memory_section
    assert "No scores of the execution-state lane" in html
    experiment = mlflow.get_experiment_by_name(params.tracking.experiment).experiment_id
    assert len(mlflow.search_traces(locations=[experiment], return_type="list")) == 2 * len(SYSTEMS)

    # A rerun keeps every instance; with one instance lost it runs that one again, to the same items.
    calls = []
    real = stage.run_instance
    monkeypatch.setattr(stage, "run_instance", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert stage.main(params, stage.Options(system=("fact-store",))) == 0 and calls == []
    out = kbench_root / "artifacts/memory/fact-store"
    before = (out / "items.jsonl").read_bytes(), (out / "probes.jsonl").read_bytes()
    info = json.loads((out / "instances.json").read_text())
    (out / "instances.json").write_text(json.dumps({k: v for k, v in info.items() if k != instances[1].instance_id}))
    assert stage.main(params, stage.Options(system=("fact-store",))) == 0 and calls == [1]
    assert ((out / "items.jsonl").read_bytes(), (out / "probes.jsonl").read_bytes()) == before
    # Outputs written before the traces were: their instances run again, to the same items and traces.
    (out / "probes.jsonl").unlink()
    assert stage.main(params, stage.Options(system=("fact-store",))) == 0 and calls == [1, 1, 1]
    assert ((out / "items.jsonl").read_bytes(), (out / "probes.jsonl").read_bytes()) == before
    # A corrupt inputs.json: one warning line naming it, and the system starts over (every lane alike).
    assert_corrupt_inputs_start_over(out, lambda: stage.main(params, stage.Options(system=("fact-store",))), caplog)
    assert calls == [1] * 5 and ((out / "items.jsonl").read_bytes(), (out / "probes.jsonl").read_bytes()) == before


def test_an_unknown_system_or_a_missing_page_input_is_named(lane, kbench_root):
    import kbench.stages.memory as stage
    from kbench.memory.systems import MemorySystemError
    from kbench.stages import memory_report

    params, _ = lane
    with pytest.raises(MemorySystemError, match=r"unknown memory system 'mem1'; registered: \["):
        stage.main(params, stage.Options(system=("mem1",)))
    with pytest.raises(memory_report.MemoryReportError, match="no scores for memory system full-context"):
        memory_report.main(params, memory_report.Options())


def test_a_malformed_instances_file_is_one_line_naming_file_and_line(kbench_root, tiny_model_dir):  # noqa: F811
    from kbench.cli.main import main

    bad = kbench_root / "instances.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    (kbench_root / "params.yaml").write_text(
        f"memory:\n  source: {bad}\nagent_base:\n  out_dir: {tiny_model_dir}\n")
    assert main(["--params", str(kbench_root / "params.yaml"), "memory-instances"]) == 2


def test_residue_reads_the_forget_versions_memory():
    from kbench.memory.records import ItemRecord
    from kbench.memory.residue import residue_rates

    def fe(iid, kind, value, old=None):
        return ItemRecord(instance_id=iid, system="s", request_id=f"{iid}/r", request_type="F6" if old else "F1",
                          suite="FE", attack=None, version="forget", probe_id=f"{iid}/{kind}", field=kind,
                          value=value, old_value=old, reply="")

    records = [fe("a", "hobby", "chess"), fe("b", "hobby", "golf"), fe("c", "car", "Volvo", old="Fiat")]
    memories = {"a": {"forget": "likes chess", "control": ""}, "b": {"forget": "nothing", "control": "golf"},
                "c": {"forget": "drives a fiat now", "control": ""}}
    rates = residue_rates(records, memories)
    assert rates.n == 3 and rates.rate == 2 / 3  # a keeps chess; c keeps the replaced Fiat
    assert rates.by_request_type["F6"].model_dump() == {"rate": 1.0, "n": 1} and rates.by_request_type["F3"].n == 0


def test_mem0s_endpoint_is_the_users_or_the_runs_and_must_answer():
    import socket

    from kbench.serving import ServingError
    from kbench.stages.memory import endpoint_for

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        silent = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
    served = Params.model_validate({"model": {"backend": "openai", "path": "served-model", "base_url": silent},
                                    "agent_base": {"enabled": False}})
    users = Params.model_validate({"memory": {"llm_base_url": silent, "llm_model": "judge"}})
    for params in (served, users):
        with pytest.raises(ServingError, match=f"the endpoint {silent} does not answer"):
            with endpoint_for(params):
                pass
