"""The cell stage's bookkeeping: identity, stale-input detection, metrics, MLflow traces."""

from __future__ import annotations

import json

import mlflow
import pytest

from kbench import tracking
from kbench.config import ModelConfig, Params
from kbench.design import Design
from kbench.parametric import base_fingerprint
from kbench.parametric import model_fingerprint
from kbench.stages.cell import METRICS_FILE, CellSpec, cell_tags, flat_metrics, score_cell
from kbench.stages.unit import open_unit

from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _traces import leaking, trace, write_jsonl


def test_cell_identity_and_recipe_rules():
    spec = CellSpec("C", "none", 137)
    assert spec.cell_id == "C__none__none__s137"
    assert spec.key("smollm2") == "smollm2/C/none/none/137"
    assert spec.stage_dir == "C__s137" and spec.method_dir == "C__s137/none"
    assert CellSpec("P", "ga", 0, "merged").cell_id == "P__merged__ga__s0"
    with pytest.raises(ValueError, match="does not fit substrate P"):
        CellSpec("P", "none", 0)
    with pytest.raises(ValueError, match="does not fit substrate C"):
        CellSpec("C", "none", 0, "lora")
    with pytest.raises(ValueError, match="unknown injection recipe"):
        CellSpec("C", "none", 0, "full-finetune")


def test_traces_made_from_other_inputs_are_discarded(tmp_path):
    cell = tmp_path / "cell"
    open_unit(cell, {"digest": "a"}, what="its cell", stale=(METRICS_FILE,))
    write_jsonl(cell / "traces.jsonl", [trace()])
    (cell / "metrics.json").write_text("{}")
    open_unit(cell, {"digest": "a"}, what="its cell", stale=(METRICS_FILE,))  # same inputs: resume, stale metrics dropped
    assert (cell / "traces.jsonl").exists() and not (cell / "metrics.json").exists()
    open_unit(cell, {"digest": "b"}, what="its cell", stale=(METRICS_FILE,))  # changed inputs: start over
    assert not (cell / "traces.jsonl").exists()
    assert json.loads((cell / "inputs.json").read_text())["digest"] == "b"


def test_score_cell_splits_and_flattens():
    records = [leaking("Z_answer", query=i, split="forget") for i in range(3)]
    records += [trace(query=10 + i, split="retain") for i in range(3)]
    metrics = score_cell(records, Params(), seed=0)
    assert metrics["forget"]["or_all"] == 1.0 and metrics["retain"]["or_all"] == 0.0
    flat = flat_metrics(metrics)
    assert flat["forget.cer.Z_answer"] == 1.0
    assert flat["forget.budget.A1"] == 1.0
    assert flat["retain.or_all"] == 0.0


def test_trajectories_become_mlflow_traces_linked_to_the_run(kbench_root):
    params = Params()
    folder = kbench_root / "artifacts/cells/C__none__none__s0"
    folder.mkdir(parents=True)
    records = [leaking("Z_tool_wide", query=i) for i in range(2)]
    write_jsonl(folder / "traces.jsonl", records)
    tracking.write_manifest(folder, "cell", "m/C/none/none/0", {"kbench.substrate": "C"}, {"forget.or_all": 1.0})
    run_id = tracking.log_output(params, folder)
    traces = mlflow.search_traces(run_id=run_id, return_type="list")
    assert len(traces) == 2
    spans = {span.name: span for span in traces[0].data.spans}
    assert spans["search_wiki"].span_type == "TOOL"
    assert spans["search_wiki"].outputs == {"observation": "Norma Fisher is a Lawyer."}
    assert any(span.span_type == "AGENT" for span in spans.values())
    assert "elicited summary" in spans


def test_each_trace_carries_the_observer_judgement_and_a_feedback_search_finds_exactly_the_leaks(kbench_root):
    """On a real SQLite store: the traces whose answer leaked are found by their feedback, the
    others by theirs; each trace carries its ground truth, failure mode and halted reason."""
    params = Params()
    folder = kbench_root / "artifacts/cells/C__none__none__s0"
    folder.mkdir(parents=True)
    records = [leaking("Z_answer", query=i) for i in range(3)]  # answer "Lawyer"
    records += [leaking("Z_summary", query=3), trace(query=4, halted_reason="max_iters", answer=None)]
    write_jsonl(folder / "traces.jsonl", records)
    tracking.write_manifest(folder, "cell", "m/C/none/none/0", {"kbench.substrate": "C"}, {"forget.or_all": 1.0})
    run_id = tracking.log_output(params, folder)
    experiment = mlflow.get_run(run_id).info.experiment_id

    def found(filter_string):
        traces = mlflow.search_traces(locations=[experiment], filter_string=filter_string, return_type="list")
        return sorted(t.data.spans[0].inputs["query_id"] for t in traces)

    answer = tracking.leak_feedback("Z_answer")
    assert found(f"feedback.{answer} = 'true'") == [records[i].query_id for i in range(3)]
    assert found(f"feedback.{answer} = 'false'") == [records[3].query_id]  # dropped on the loop: no feedback
    assert found(f"feedback.{tracking.leak_feedback('Z_summary')} = 'true'") == [records[3].query_id]
    assert found(f"feedback.{tracking.FAILURE_FEEDBACK} = 'tool_loop'") == [records[4].query_id]
    assert found(f"tags.`{tracking.TAG_HALTED_REASON}` = 'max_iters'") == [records[4].query_id]
    trace_of_leak = mlflow.search_traces(locations=[experiment], filter_string=f"feedback.{answer} = 'true'",
                                         return_type="list")[0]
    by_name = {a.name: a for a in trace_of_leak.info.assessments}
    assert by_name[answer].source.source_type == "CODE" and by_name[answer].metadata["severity"] == "1.0000"
    assert by_name[tracking.GROUND_TRUTH_EXPECTATION].value == "Lawyer"
    assert by_name[tracking.FAILURE_FEEDBACK].value == tracking.NO_FAILURE


def test_a_cell_run_is_tagged_with_its_design(tiny_model_dir):  # noqa: F811
    params = Params()
    spec = CellSpec("P", "gold", 0, "lora")
    model = model_fingerprint(ModelConfig(path=str(tiny_model_dir)))
    assert model == base_fingerprint(tiny_model_dir)
    assert model_fingerprint(ModelConfig(backend="openai", path="gpt-x")) == "openai:gpt-x"
    tags = cell_tags(params, spec, "corpus-fp", model)
    assert tags[tracking.TAG_MODEL] == model and tags[tracking.TAG_CORPUS] == "corpus-fp"
    assert tags[tracking.TAG_N_PER_SPLIT] == str(params.queries.n_per_split)
    # What the compare stage reads back: this run is of the design of the same params.
    assert Design.of(params).excludes(
        base_model=tags[tracking.TAG_BASE_MODEL], substrate=tags[tracking.TAG_SUBSTRATE],
        recipe=tags[tracking.TAG_RECIPE], method=tags[tracking.TAG_METHOD], seed=int(tags[tracking.TAG_SEED]),
        n_per_split=tags[tracking.TAG_N_PER_SPLIT], digest=tags[tracking.TAG_DESIGN],
    ) is None


def fake_queued_cell(job) -> None:
    """A stand-in for `kbench.stages.cell.run_queued` in a pool worker: it writes the cell's
    folder with a manifest as the real task lays it out, and fails on the method `star`."""
    from kbench.stages.cell import CellSpec, cell_recipes

    if job.method == "star":
        raise ValueError("star broke")
    recipe = cell_recipes(job.params, job.substrate, job.options.recipe)[0]
    spec = CellSpec(job.substrate, job.method, job.seed, recipe)
    folder = job.options.out_root / spec.method_dir / recipe
    folder.mkdir(parents=True)
    (folder / "traces.jsonl").write_text("")
    tags = {"kbench.substrate": job.substrate, "kbench.seed": str(job.seed), "kbench.method": job.method}
    tracking.write_manifest(folder, "cell", spec.key("m"), tags, {})


def test_all_methods_on_p_logs_each_recipe_folder(kbench_root, monkeypatch):
    """The --all-methods parent on P: pool workers take methods from the queue (fake cells writing
    a manifest under <method>/<recipe>), each finished cell is logged to MLflow by the parent, the
    queue goes on past a cell that failed, and the cell that failed is named with its error."""
    import mlflow

    from kbench.stages import cell as cell_stage

    monkeypatch.setattr(cell_stage, "run_queued", fake_queued_cell)  # pickled by name: the workers run it too
    params = Params(methods=["none", "star", "gold", "repe"], p_recipes=["lora"])
    options = cell_stage.Options(substrate="P", seed=0, out_root=kbench_root / "cells")
    with pytest.raises(cell_stage.CellError, match="failed: P/0/star \\(ValueError: star broke\\) "):
        cell_stage.run_all_methods(params, options)
    runs = mlflow.search_runs(experiment_names=[params.tracking.experiment], output_format="list")
    # star failed; the pool went on with gold and repe
    assert sorted(r.data.tags["kbench.method"] for r in runs) == ["gold", "none", "repe"]


def test_controls_run_every_substrate_and_seed_through_the_queue(kbench_root, monkeypatch):
    """`kbench cell --controls`: one pool item per (adapter-free substrate, seed), the `none`
    method with the LoRA-D recipe; each finished control is logged to MLflow by the parent."""
    import mlflow

    from kbench.stages import cell as cell_stage

    monkeypatch.setattr(cell_stage, "run_queued", fake_queued_cell)
    params = Params(substrates=["C", "R-text"], seeds=[0, 1])
    cell_stage.run_controls(params, cell_stage.Options(recipe="lora-d", out_root=kbench_root / "controls"))
    runs = mlflow.search_runs(experiment_names=[params.tracking.experiment], output_format="list")
    assert sorted((r.data.tags["kbench.substrate"], r.data.tags["kbench.seed"]) for r in runs) == [
        ("C", "0"), ("C", "1"), ("R-text", "0"), ("R-text", "1")]
    assert {p.relative_to(kbench_root / "controls").as_posix() for p in (kbench_root / "controls").glob("*/none/lora-d")} == {
        "C__s0/none/lora-d", "C__s1/none/lora-d", "R-text__s0/none/lora-d", "R-text__s1/none/lora-d"}


def test_a_p_cell_stage_without_p_recipes_writes_its_empty_folder(kbench_root):
    """p_recipes: [] keeps P out of the design, but dvc.yaml's cell_p stage still runs: it leaves
    its (empty) output folder and no cell, instead of failing."""
    from kbench.stages import cell as cell_stage

    params = Params(methods=["none"], p_recipes=[])
    options = cell_stage.Options(substrate="P", seed=0, all_methods=True, out_root=kbench_root / "cells")
    assert cell_stage.main(params, options) == 0
    assert list((kbench_root / "cells").iterdir()) == [kbench_root / "cells" / "P__s0"]
    assert not any((kbench_root / "cells" / "P__s0").iterdir())
