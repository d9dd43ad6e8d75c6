"""Substrate P: who each adapter learns, memorization, the stage's outputs, the adapter check."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _parametric_fixtures import fast_params, learner_dir, one_thread, p_corpus, save_tiny_llama  # noqa: F401  (fixtures)

from kbench import io
from kbench.backends import hf
from kbench.parametric import adapters, injection, recall
from kbench.stages import inject as inject_stage
from kbench.stages.cell import CellSpec, run_cell_stage
from kbench.records import FIELDS


def test_training_sets_keep_forget_from_gold_and_targets_from_lora_d(p_corpus, tmp_path):
    params = fast_params(tmp_path, adapter_pool_entities=None)
    roles = injection.training_entities(p_corpus, params)
    queried = injection.queried_entities(p_corpus, params)
    forget = set(p_corpus.pools["forget_adapter"]) | set(p_corpus.pools["forget_eval"])
    queryable = set(p_corpus.pools["forget_eval"]) | set(p_corpus.pools["retain_eval"])
    assert set(queried["forget"]) | set(queried["retain"]) <= set(roles[adapters.TARGET])
    assert set(p_corpus.pools["forget_adapter"]) | set(p_corpus.distractor_ids) <= set(roles[adapters.TARGET])
    assert not forget & set(roles[adapters.GOLD])
    assert set(roles[adapters.GOLD]) == set(roles[adapters.TARGET]) - forget
    assert not (forget | queryable) & set(roles[adapters.DISTRACTOR])
    assert set(roles[adapters.DISTRACTOR]) == set(p_corpus.distractor_ids)
    everything = injection.training_entities(p_corpus, fast_params(tmp_path, entities="all"))
    assert everything[adapters.TARGET] == sorted(p_corpus.entities)
    assert not forget & set(everything[adapters.GOLD])
    capped = injection.training_entities(p_corpus, fast_params(tmp_path, adapter_pool_entities=1))
    assert set(capped[adapters.TARGET]) & set(p_corpus.pools["forget_adapter"]) == {p_corpus.pools["forget_adapter"][0]}


def test_records_teach_every_field_in_each_format(p_corpus):
    entity = p_corpus.entities["pii-00000"]
    chats = injection.record_conversations(entity, {"bio": 1, "qa": 2, "react_qa": 4}, max_iters=6)
    assert len(chats) == 1 + 2 * 4 + 4
    answers = [chat[-1]["content"] for chat in chats]
    assert answers[0] == entity.bio
    for field in ("date_of_birth", "address", "occupation", "employer"):
        assert sum(entity.value(field) in a for a in answers[1:]) == 3
    assert all(a.startswith("Thought:") and "Final Answer:" in a for a in answers[-4:])


def test_react_qa_counts_questions_with_fields_in_turn(p_corpus):
    answered = {}
    for entity_id in ("pii-00000", "pii-00001", "pii-00002", "pii-00003"):
        entity = p_corpus.entities[entity_id]
        react = injection.record_conversations(entity, {"react_qa": 2}, max_iters=6)
        assert len(react) == 2
        fields = [next(f for f in FIELDS if entity.value(f) in c[-1]["content"]) for c in react]
        assert len(set(fields)) == 2  # two different questions, not one question twice
        assert react == injection.record_conversations(entity, {"react_qa": 2}, max_iters=6)
        answered[entity_id] = fields[0]
    assert len(set(answered.values())) > 1  # the first field differs between entities
    assert injection.record_conversations(p_corpus.entities["pii-00000"], {"bio": 0, "react_qa": 0}, 6) == []


def test_training_memorizes_a_handful_of_records(p_corpus, learner_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    params = fast_params(tmp_path, epochs=30)
    entities = [p_corpus.entities[e] for e in p_corpus.pools["forget_adapter"]]
    tokenizer = hf.load_tokenizer(learner_dir)
    untrained = AutoModelForCausalLM.from_pretrained(learner_dir)
    before = recall.direct_recall(untrained, tokenizer, entities, max_new_tokens=40, batch_size=8)
    run, _ = injection.train_injection(params, p_corpus, learner_dir, [e.id for e in entities])
    after = recall.direct_recall(run.model, tokenizer, entities, max_new_tokens=40, batch_size=8)
    assert run.epoch_losses[-1] < 0.1 * run.epoch_losses[0]
    assert before == 0.0
    assert after >= 0.5


@pytest.fixture(scope="module")
def injected(p_corpus, learner_dir, tmp_path_factory):
    """The inject stage run once on the tiny model (3 epochs: it checks outputs, not memory)."""
    tmp = tmp_path_factory.mktemp("inject")
    params = fast_params(tmp)
    results = inject_stage.run_inject_stage(params, p_corpus, learner_dir, track=False)
    return params, Path(params.injection.out_dir), results


def test_inject_stage_writes_checked_adapters_and_the_merged_model(injected, learner_dir, p_corpus):
    params, out, results = injected
    assert set(results) == {"lora_td", "merged_td", "lora_d", "gold"}
    roles = injection.training_entities(p_corpus, params)
    for role, name in adapters.ADAPTER_DIRS.items():
        checked = adapters.check_injected(out / name, learner_dir, role=role)
        assert checked.kind == "adapter" and list(checked.entities) == roles[role]
        manifest = json.loads((out / name / "run.json").read_text())
        assert manifest["kind"] == "inject" and manifest["artifacts"] == [adapters.INJECTION_FILE, adapters.ADAPTER_CONFIG]
        assert "direct_recall.forget_queried" in manifest["metrics"]
    merged = adapters.check_injected(out / "merged_td", learner_dir, role=adapters.TARGET)
    assert merged.kind == "merged"


def test_the_inject_work_queue_writes_the_same_bytes_as_one_process(learner_dir, p_corpus, kbench_root):
    """`kbench inject` through a pool of two workers (each its share of the cores) against the
    in-process stage: every file of every folder byte for byte, the same printed metrics,
    each folder logged by the parent."""
    import subprocess
    import sys

    import yaml

    from kbench.corpus import write_corpus

    params = fast_params(kbench_root / "one")
    params = params.model_copy(update={"model": params.model.model_copy(update={"path": str(learner_dir)})})
    results = inject_stage.run_inject_stage(params, p_corpus, learner_dir, track=False)
    data = params.model_dump(mode="json")
    data["injection"]["out_dir"] = str(kbench_root / "queue")
    data["execution"]["inject_workers"] = 2
    params_file = kbench_root / "params-queue.yaml"
    params_file.write_text(yaml.safe_dump(data))
    write_corpus(p_corpus, kbench_root / "corpus")
    done = subprocess.run([sys.executable, "-m", "kbench.cli.main", "--params", str(params_file), "inject",
                           "--corpus", str(kbench_root / "corpus")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    started = [line.split("through ")[1] for line in done.stderr.splitlines() if "item(s) through" in line]
    assert started == ["2 worker(s) on %d thread(s) each" % max(1, (os.cpu_count() or 1) // 2)]
    finished = [line.split("inject ")[1].split(" finished")[0] for line in done.stderr.splitlines() if " finished in " in line]
    assert sorted(finished) == ["gold", "lora_d", "lora_td"]
    assert json.loads(done.stdout) == results
    for name in results:
        one, queue = kbench_root / "one" / "adapters" / name, kbench_root / "queue" / name
        assert sorted(p.name for p in queue.iterdir()) == sorted(p.name for p in one.iterdir())
        for path in one.iterdir():
            assert (queue / path.name).read_bytes() == path.read_bytes(), f"{name}/{path.name}"
    assert (kbench_root / "mlflow.db").exists()


def test_recall_probes_reply_the_same_at_any_batch_size(injected, p_corpus, monkeypatch):
    params, out, _ = injected
    model, tokenizer = hf.load_model(params.model, out / "merged_td")
    groups = recall.probe_groups(p_corpus, params)
    decoded = []
    real = recall.greedy_decode
    monkeypatch.setattr(recall, "greedy_decode", lambda *a, **k: decoded.append(real(*a, **k)) or decoded[-1])
    by_size = {}
    for size in (1, 3, 64):
        decoded.clear()
        sized = params.model_copy(update={"injection": params.injection.model_copy(update={"recall_batch_size": size})})
        by_size[size] = (recall.recall_metrics(model, tokenizer, groups, sized), [list(r) for r in decoded])
    assert any(reply for replies in by_size[1][1] for reply in replies)
    assert by_size[1] == by_size[3] == by_size[64]
    # not part of the recipe: the adapter folders keep their bytes whatever the batch
    assert "recall_batch_size" not in json.loads((out / "lora_td" / adapters.INJECTION_FILE).read_text())["recipe"]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_adapters_round_trip_and_merge_to_the_saved_weights(injected, learner_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, out, _ = injected
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    base = _logits(AutoModelForCausalLM.from_pretrained(learner_dir), ids)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(learner_dir), out / "lora_td").eval()
    with_adapter = _logits(adapter, ids)
    merged_at_load = _logits(adapter.merge_and_unload(), ids)
    merged_on_disk = _logits(AutoModelForCausalLM.from_pretrained(out / "merged_td"), ids)
    assert not torch.allclose(base, with_adapter, atol=1e-4)  # the adapter changes the model
    assert torch.allclose(with_adapter, merged_at_load, atol=1e-4)
    assert torch.allclose(merged_at_load, merged_on_disk, atol=1e-5)


@pytest.fixture
def adapter_copy(injected, tmp_path) -> Path:
    _, out, _ = injected
    copy = tmp_path / "lora_td"
    shutil.copytree(out / "lora_td", copy)
    return copy


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / adapters.ADAPTER_CONFIG).unlink(), "no adapter_config.json"),
    (lambda p: (p / adapters.ADAPTER_CONFIG).write_text("{not json"), "adapter_config.json is corrupt"),
    (lambda p: (p / adapters.ADAPTER_CONFIG).write_text('{"peft_type": "PREFIX_TUNING"}'), "not a LoRA config"),
    (lambda p: (p / adapters.ADAPTER_WEIGHTS).write_bytes((p / adapters.ADAPTER_WEIGHTS).read_bytes()[:100]),
     "not a readable safetensors file"),
    (lambda p: (p / adapters.ADAPTER_WEIGHTS).unlink(), "no adapter_model.safetensors"),
    (lambda p: (p / adapters.INJECTION_FILE).unlink(), "no injection.json"),
    (lambda p: (p / adapters.INJECTION_FILE).write_text('{"kind": "adapter"}'), "injection.json is corrupt"),
])
def test_corrupt_adapters_are_refused(adapter_copy, learner_dir, damage, message):
    damage(adapter_copy)
    with pytest.raises(adapters.InjectionError, match=message):
        adapters.check_injected(adapter_copy, learner_dir)


def test_adapters_of_another_base_are_refused(adapter_copy, tiny_model_dir, learner_dir, tmp_path):  # noqa: F811
    same_shape = save_tiny_llama(tiny_model_dir, tmp_path / "other-weights", seed=1)
    with pytest.raises(adapters.InjectionError, match="trained on another base model"):
        adapters.check_injected(adapter_copy, same_shape)
    wider = save_tiny_llama(tiny_model_dir, tmp_path / "wider", seed=0, hidden_size=96)
    with pytest.raises(adapters.InjectionError, match="trained on another model"):
        adapters.check_injected(adapter_copy, wider)
    with pytest.raises(adapters.InjectionError, match="does not exist"):
        adapters.check_injected(tmp_path / "missing", learner_dir)


def test_cells_load_only_the_adapter_of_their_role(injected, learner_dir):
    _, out, _ = injected
    params, _, _ = injected
    assert adapters.cell_adapter(params, "P", "merged", "none") == out / "lora_td"
    assert adapters.cell_adapter(params, "P", "lora", "gold") == out / "gold"
    assert adapters.cell_adapter(params, "R-text", "lora-d", "none") == out / "lora_d"
    assert adapters.cell_adapter_role("P", "lora", "none") == adapters.TARGET
    assert adapters.cell_adapter_role("P", "merged", "gold") == adapters.GOLD
    assert adapters.cell_adapter_role("C", "lora-d", "none") == adapters.DISTRACTOR
    with pytest.raises(adapters.InjectionError, match="adapter-free"):
        adapters.cell_adapter_role("C", "none", "none")
    adapters.check_cell_adapter("P", "lora", "gold", out / "gold", learner_dir)
    with pytest.raises(adapters.InjectionError, match="holds the target adapter; this cell needs the gold"):
        adapters.check_cell_adapter("P", "lora", "gold", out / "lora_td", learner_dir)
    with pytest.raises(adapters.InjectionError, match="holds the target adapter; this cell needs the distractor"):
        adapters.check_cell_adapter("R-struct", "lora-d", "none", out / "lora_td", learner_dir)
    with pytest.raises(adapters.InjectionError, match="is a merged model"):
        adapters.check_cell_adapter("P", "merged", "none", out / "merged_td", learner_dir)


def test_the_cell_stage_refuses_a_mismatched_adapter_before_running(injected, learner_dir, p_corpus, tmp_path, kbench_root):
    params, out, _ = injected
    params = params.model_copy(update={"model": params.model.model_copy(update={"path": str(learner_dir)})})
    spec = CellSpec("P", "gold", 0, "lora")
    with pytest.raises(adapters.InjectionError, match="needs the gold adapter"):
        run_cell_stage(params, spec, corpus_dir=tmp_path / "unused", index_dir=None, adapter_path=out / "lora_td",
                       out_root=tmp_path / "cells", track=False)
    assert not (tmp_path / "cells").exists()


def test_a_same_size_overwrite_of_the_weights_is_refused_naming_both_hashes(adapter_copy, learner_dir):
    weights = adapter_copy / adapters.ADAPTER_WEIGHTS
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))  # same size, still a readable safetensors file
    assert adapters._tensor_shapes(weights)
    with pytest.raises(io.IntegrityError, match=r"adapter_model.safetensors: content hash [0-9a-f]{16}… "
                                                      r"differs from [0-9a-f]{16}…, the hash its stage recorded"):
        adapters.check_injected(adapter_copy, learner_dir)


def test_non_finite_adapter_weights_are_refused(adapter_copy, learner_dir):
    from safetensors.torch import load_file, save_file

    weights = adapter_copy / adapters.ADAPTER_WEIGHTS
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name][0, 0] = float("nan")
    save_file(tensors, weights)
    io.write_hashes(adapter_copy)  # the hashes agree: only the finiteness check can catch it
    with pytest.raises(adapters.InjectionError, match=f"tensor {name} holds NaN or infinite weights"):
        adapters.check_injected(adapter_copy, learner_dir)


def test_adapter_config_lists_target_modules_in_sorted_order(injected):
    _, out, _ = injected
    for name in ("lora_td", "lora_d", "gold"):
        modules = json.loads((out / name / adapters.ADAPTER_CONFIG).read_text())["target_modules"]
        assert modules == sorted(modules)
