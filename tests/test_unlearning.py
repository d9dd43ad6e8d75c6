"""Weight methods on P: each loss moves a planted memorized record the right way, NPO equals its
formula, O3's gate routes by the detector, the matched budget is enforced, and the `unlearn`
stage writes checked folders that P cells deploy."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _parametric_fixtures import fast_params, learner_dir, one_thread, p_corpus  # noqa: F401  (fixtures)

from kbench.backends import hf
from kbench.config import ParamsError, UnlearningConfig, parse_params
from kbench.corpus import write_corpus
from kbench.methods import MethodContext, build_method, register_method, unregister_method
from kbench.methods.npo import npo_forget_loss
from kbench.methods.o3 import detector_flip
from kbench.methods.unlearning import (
    FORGET_SET,
    P_ONLY,
    Scored,
    StepLoss,
    UnlearnStep,
    WeightMethod,
    method_budget,
)
from kbench.parametric import adapters, injection
from kbench.parametric.lora import tokenize_chat
from kbench.parametric.unlearning import (
    CONTINUED,
    STACKED,
    UnlearningError,
    check_unlearned,
    score,
    train_unlearning,
)
from kbench.records import FORGET, Query
from kbench.stages import inject as inject_stage
from kbench.stages import unlearn as unlearn_stage
from kbench.stages.cell import CellSpec, run_cell_stage

WEIGHT_METHODS = ["ga", "gd", "npo", "npo-kl", "simnpo", "idk", "cha", "rmu", "o3", "wga", "undial"]


# -- a planted memorized record ----------------------------------------------------------------
def _qa(entity, field: str) -> list[dict]:
    query = Query.canonical(entity, field)
    return [
        {"role": "system", "content": injection.ASSISTANT_SYSTEM},
        {"role": "user", "content": query.question},
        {"role": "assistant", "content": f"{entity.value(field)}"},
    ]


@pytest.fixture(scope="module")
def planted(p_corpus, learner_dir):
    """A LoRA that memorized 2 forget and 2 retain records of the tiny model, with the sets."""
    from transformers import AutoModelForCausalLM

    tokenizer = hf.load_tokenizer(learner_dir)
    forget_e = [p_corpus.entities[e] for e in p_corpus.pools["forget_eval"][:2]]
    retain_e = [p_corpus.entities[e] for e in p_corpus.pools["retain_eval"][:2]]
    sets = {
        "forget": [tokenize_chat(tokenizer, _qa(e, "occupation"), 256) for e in forget_e],
        "retain": [tokenize_chat(tokenizer, _qa(e, "occupation"), 256) for e in retain_e],
        "alternate": [tokenize_chat(tokenizer, [*_qa(e, "occupation")[:-1], {"role": "assistant", "content": "I don't know."}], 256)
                      for e in forget_e],
    }
    from kbench.config import LoraConfig
    from kbench.parametric.lora import train_lora

    model = AutoModelForCausalLM.from_pretrained(learner_dir, dtype=torch.float32)
    run = train_lora(model, sets["forget"] + sets["retain"],
                     LoraConfig(rank=8, alpha=16, epochs=40, batch_size=4, micro_batch_size=4, learning_rate=1e-2))
    for p in run.model.parameters():
        p.requires_grad_(False)
    return run.model, sets


def _nll(model, examples) -> float:
    with torch.no_grad():
        return float(score(model, examples).mean_nll())


def _trainable_copy(model):
    clone = copy.deepcopy(model)
    for name, p in clone.named_parameters():
        p.requires_grad_("lora_" in name)
    return clone


def _method(name: str, p_corpus, **section):
    params = parse_params({"methods": ["none", name], "method_params": {name: section} if section else {}})
    return build_method(name, MethodContext(p_corpus, params, seed=0)), params


def test_the_planted_records_are_memorized(planted):
    model, sets = planted
    assert _nll(model, sets["forget"]) < 0.1 and _nll(model, sets["retain"]) < 0.1


BUDGET = UnlearningConfig(epochs=4, batch_size=2, learning_rate=1e-2, max_grad_norm=None)


@pytest.mark.parametrize("name", ["ga", "gd", "npo", "npo-kl", "simnpo", "idk", "cha", "wga", "undial", "rmu"])
def test_each_loss_raises_the_forget_nll_within_a_few_steps(name, planted, p_corpus):
    model, sets = planted
    method, _ = _method(name, p_corpus, **({"layer": 1, "steering_coefficient": 20.0} if name == "rmu" else {}))
    trained = _trainable_copy(model)
    method.begin(trained, None)
    before_f, before_r = _nll(trained, sets["forget"]), _nll(trained, sets["retain"])
    run = train_unlearning(trained, method, sets["forget"], sets["retain"], BUDGET,
                           alternates=sets["alternate"] if method.needs_alternates else None,
                           hidden_layer=method.hidden_layer())
    after_f, after_r = _nll(trained, sets["forget"]), _nll(trained, sets["retain"])
    assert len(run.loss) == 4 and all(math.isfinite(v) for v in run.loss)
    assert after_f > before_f + 0.5, (name, before_f, after_f)
    if name in {"gd", "npo-kl", "cha"}:  # a retain term holds the retain records
        assert after_r < before_r + 0.5 * (after_f - before_f), (name, before_r, after_r)


def test_ga_without_a_retain_term_lets_the_retain_nll_go(planted, p_corpus):
    model, sets = planted
    method, _ = _method("ga", p_corpus)
    trained = _trainable_copy(model)
    run = train_unlearning(trained, method, sets["forget"], sets["retain"],
                           UnlearningConfig(epochs=8, batch_size=2, learning_rate=1e-2, max_grad_norm=None))
    assert all(v == 0.0 for v in run.retain_loss)  # nothing holds the retain set
    assert all(v is None for v in run.retain_nll)  # and it is never even scored
    assert _nll(trained, sets["forget"]) > 1.0


def test_o3_learns_the_refusal_and_stays_orthogonal_to_the_target(planted, p_corpus, tmp_path):
    model, sets = planted
    target = tmp_path / "target"
    model.save_pretrained(target)
    import peft

    stacked = peft.get_peft_model(copy.deepcopy(model).merge_and_unload(),
                                  peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    method, _ = _method("o3", p_corpus)
    method.begin(stacked, target)
    penalty_before = float(method.orthogonality_penalty().detach())
    before = _nll(stacked, sets["alternate"])
    train_unlearning(stacked, method, sets["forget"], sets["retain"], BUDGET, alternates=sets["alternate"])
    assert _nll(stacked, sets["alternate"]) < before - 0.5
    assert float(method.orthogonality_penalty().detach()) <= penalty_before + 1e-6


def test_npo_loss_equals_its_formula_on_hand_computed_log_probabilities():
    # two one-token examples, vocabulary of 2: the model gives p = 0.75 and 0.4 to the answer, the reference 0.5 and 0.5
    def scored(p: list[float]) -> Scored:
        logits = torch.log(torch.tensor([[1 - q, q] for q in p], dtype=torch.float64))
        return Scored(logits, torch.ones(len(p), dtype=torch.long), torch.arange(len(p)), len(p))

    state = {"reference": False}

    class Swap:
        def __enter__(self):
            state["reference"] = True

        def __exit__(self, *exc):
            state["reference"] = False

    step = UnlearnStep(None, {FORGET_SET: [object(), object()]}, Swap,
                       lambda rows: scored([0.5, 0.5] if state["reference"] else [0.75, 0.4]))
    beta = 0.1
    expected = -2 / beta * sum(
        math.log(1 / (1 + math.exp(-beta * (math.log(ref) - math.log(p))))) for p, ref in ((0.75, 0.5), (0.4, 0.5))
    ) / 2
    assert float(npo_forget_loss(step, beta)) == pytest.approx(expected, rel=1e-9)
    # NPO's starting loss (model = reference) is (2 / beta) log 2, whatever the data
    same = UnlearnStep(None, {FORGET_SET: [object()]}, Swap, lambda rows: scored([0.3]))
    assert float(npo_forget_loss(same, beta)) == pytest.approx(2 / beta * math.log(2))


# -- O3's gate -------------------------------------------------------------------------------
@pytest.mark.parametrize("accuracy", [1.0, 0.9, 0.75])
def test_the_detector_flips_the_stated_fraction(accuracy):
    flips = sum(detector_flip(0, f"q{i}", accuracy) for i in range(20000)) / 20000
    assert flips == pytest.approx(1 - accuracy, abs=0.01)
    assert [detector_flip(0, f"q{i}", accuracy) for i in range(50)] == [detector_flip(0, f"q{i}", accuracy) for i in range(50)]


def test_o3_variants_gate_at_their_accuracies(p_corpus):
    queries = [Query.canonical(p_corpus.entities[e], "occupation") for e in p_corpus.entities]
    for name, accuracy in (("o3", 1.0), ("o3-90", 0.9), ("o3-75", 0.75)):
        method, _ = _method(name, p_corpus)
        assert method.trained_as() == "o3" and method.config.detector_accuracy == accuracy
        wrong = [method.gate(q) != (p_corpus.split_of(q.entity_id) == FORGET) for q in queries]
        assert sum(wrong) == sum(detector_flip(0, q.query_id, accuracy) for q in queries)
    o3, _ = _method("o3", p_corpus)
    assert all(o3.gate(q) == (p_corpus.split_of(q.entity_id) == FORGET) for q in queries)


def test_o3_hook_applies_the_unlearn_lora_to_gated_rows_only(planted, p_corpus, tmp_path):
    model, _ = planted
    import peft

    base = copy.deepcopy(model).merge_and_unload()
    unlearn = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in unlearn.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    folder = tmp_path / "o3"
    unlearn.save_pretrained(folder)
    method, _ = _method("o3", p_corpus)
    method.load_unlearned(type("U", (), {"path": folder, "kind": STACKED})())
    forget_q = Query.canonical(p_corpus.entities[p_corpus.pools["forget_eval"][0]], "occupation")
    retain_q = Query.canonical(p_corpus.entities[p_corpus.pools["retain_eval"][0]], "occupation")

    class Backend:
        batch_rows = (0, 1)

    Backend.model = base
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        with method.forward_hooks(Backend(), [forget_q, retain_q]):
            gated = base(input_ids=ids).logits
        expected = unlearn(input_ids=ids[:1]).logits
    assert torch.allclose(gated[1], plain[1])  # the retain row: the target alone
    assert not torch.allclose(gated[0], plain[0])
    assert torch.allclose(gated[0], expected[0], atol=1e-5)  # the forget row: target + unlearn LoRA


# -- the matched budget ----------------------------------------------------------------------
def test_an_undeclared_budget_override_is_refused_naming_the_key():
    params = parse_params({"methods": ["none", "ga"], "method_params": {"ga": {"budget": {"learning_rate": 0.1}}}})
    with pytest.raises(ParamsError, match=r"method_params\.ga\.budget\.learning_rate .*declares no exception"):
        method_budget("ga", params)
    bad = parse_params({"methods": ["none", "ga"], "method_params": {"ga": {"budget": {"out_dir": "x"}}}})
    with pytest.raises(ParamsError, match="not a budget key"):
        method_budget("ga", bad)


def test_a_declared_exception_is_applied_and_reported():
    @register_method("slow-ga", substrates=P_ONLY, hooks=frozenset({"weights"}))
    class SlowGA(WeightMethod):
        budget_exceptions = {"learning_rate": "diverges at the shared rate"}

        def unlearning_loss(self, step):
            return StepLoss(forget=-step.policy(FORGET_SET).mean_nll())

    try:
        params = parse_params({"methods": ["none", "slow-ga"],
                               "method_params": {"slow-ga": {"budget": {"learning_rate": 1e-5}}}})
        budget, exceptions = method_budget("slow-ga", params)
        assert budget.learning_rate == 1e-5 and budget.epochs == params.unlearning.epochs
        assert exceptions == {"learning_rate": "diverges at the shared rate"}
        shared, none = method_budget("slow-ga", parse_params({"methods": ["none", "slow-ga"]}))
        assert shared == parse_params({}).unlearning and none == {}
    finally:
        unregister_method("slow-ga")


def test_a_nan_loss_stops_the_run_with_a_clear_error(planted, p_corpus):
    model, sets = planted

    class Diverges:
        name = "diverges"

        def unlearning_loss(self, step):
            return StepLoss(forget=step.policy(FORGET_SET).mean_nll() * float("nan"))

    with pytest.raises(UnlearningError, match="loss became nan at step 1; nothing was written"):
        train_unlearning(_trainable_copy(model), Diverges(), sets["forget"], sets["retain"], BUDGET)


def test_the_trainer_is_seeded(planted, p_corpus):
    model, sets = planted
    method, _ = _method("gd", p_corpus)
    runs = [train_unlearning(_trainable_copy(model), method, sets["forget"], sets["retain"], BUDGET) for _ in range(2)]
    assert runs[0].loss == runs[1].loss


# -- the stage and the cells -------------------------------------------------------------------
@pytest.fixture(scope="module")
def unlearned(p_corpus, learner_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unlearn")
    base = fast_params(tmp, epochs=10)
    params = base.model_copy(update={
        "methods": ["none", "ga", "o3", "o3-75"], "p_recipes": ["lora", "merged"],
        "unlearning": UnlearningConfig(out_dir=str(tmp / "unlearned"), epochs=1, batch_size=4, learning_rate=1e-2),
        "model": base.model.model_copy(update={"path": str(learner_dir)}),
    })
    inject_stage.run_inject_stage(params, p_corpus, learner_dir, track=False)
    results = unlearn_stage.run_unlearn_stage(params, p_corpus, track=False)
    return params, tmp, results


def test_the_stage_trains_each_weight_method_once_per_recipe(unlearned, learner_dir):
    params, tmp, results = unlearned
    assert set(results) == {"ga/lora", "o3/lora", "ga/merged", "o3/merged"}  # o3-75 deploys o3's weights
    source = unlearn_stage.io.folder_hash(unlearn_stage.target_adapter(params))
    kinds = {}
    for key in results:
        name, recipe = key.split("/")
        folder = Path(params.unlearning.out_dir) / name / recipe
        checked = check_unlearned(folder, learner_dir, method=name, recipe=recipe, source_hash=source)
        kinds[key] = checked.kind
        info = json.loads((folder / adapters.INJECTION_FILE).read_text())["unlearning"]
        assert len(info["curves"]["forget_loss"]) == results[key]["steps"]
        budget, exceptions = method_budget(name, params)
        assert info["budget"] == budget.model_dump(mode="json") and info["budget_exceptions"] == exceptions
        if name == "ga":  # the matched budget
            assert budget == params.unlearning and exceptions == {}
        else:  # o3 declares its learning-rate exception
            assert budget.learning_rate == 0.01 and set(exceptions) == {"learning_rate"}
            assert budget.model_copy(update={"learning_rate": params.unlearning.learning_rate}) == params.unlearning
        manifest = json.loads((folder / "run.json").read_text())
        assert manifest["kind"] == "unlearn" and len(manifest["curves"]["loss"]) == results[key]["steps"]
    assert kinds == {"ga/lora": CONTINUED, "o3/lora": STACKED, "ga/merged": STACKED, "o3/merged": STACKED}


def test_a_rerun_resumes_and_the_same_params_give_the_same_bytes(unlearned, p_corpus, caplog):
    params, tmp, _ = unlearned
    folder = Path(params.unlearning.out_dir) / "ga" / "lora"
    before = (folder / "adapter_model.safetensors").read_bytes()
    stamp = folder.stat().st_mtime_ns
    with caplog.at_level("INFO"):
        unlearn_stage.run_unlearn_stage(params, p_corpus, track=False)
    assert folder.stat().st_mtime_ns == stamp and "finished earlier with the same inputs" in caplog.text
    again = params.model_copy(update={"unlearning": params.unlearning.model_copy(update={"out_dir": str(tmp / "again")})})
    unlearn_stage.run_unlearn_stage(again, p_corpus, track=False, runs=[("ga", "lora")])
    assert (tmp / "again" / "ga" / "lora" / "adapter_model.safetensors").read_bytes() == before


def test_unlearned_folders_are_refused_when_stale_or_for_another_method(unlearned, learner_dir):
    params, _, _ = unlearned
    folder = Path(params.unlearning.out_dir) / "ga" / "lora"
    source = unlearn_stage.io.folder_hash(unlearn_stage.target_adapter(params))
    with pytest.raises(adapters.InjectionError, match="another LoRA-T\\+D"):
        check_unlearned(folder, learner_dir, method="ga", recipe="lora", source_hash="0" * 20)
    with pytest.raises(adapters.InjectionError, match="holds ga's unlearning of recipe lora, not o3's"):
        check_unlearned(folder, learner_dir, method="o3", recipe="lora", source_hash=source)
    with pytest.raises(adapters.InjectionError, match="does not exist .*kbench unlearn"):
        check_unlearned(folder.parent / "nope", learner_dir, method="ga", recipe="nope", source_hash=source)


@pytest.mark.parametrize("method,recipe", [("ga", "lora"), ("ga", "merged"), ("o3-75", "lora")])
def test_p_cells_deploy_the_unlearned_weights(unlearned, p_corpus, kbench_root, method, recipe):
    params, tmp, _ = unlearned
    params = params.model_copy(update={"queries": params.queries.model_copy(update={"forms": []})})  # no ladder
    corpus_dir = tmp / "corpus"
    if not corpus_dir.exists():
        write_corpus(p_corpus, corpus_dir)
    out = run_cell_stage(params, CellSpec("P", method, 0, recipe), corpus_dir=corpus_dir, index_dir=None,
                         out_root=tmp / "cells", track=False, progress=False)
    inputs = json.loads((out / "inputs.json").read_text())
    manifest = json.loads((out / "run.json").read_text())
    assert inputs["unlearned"] and manifest["tags"]["kbench.unlearn_key"].endswith(f"/o3/{recipe}" if "o3" in method else f"/ga/{recipe}")
    exceptions = json.loads(manifest["tags"]["kbench.budget_exceptions"])
    assert list(exceptions) == (["learning_rate"] if "o3" in method else [])
    assert (out / "traces.jsonl").read_text().count("\n") == 2 * params.queries.n_per_split


def test_a_p_cell_of_a_weight_method_without_its_weights_is_refused(unlearned, p_corpus, kbench_root):
    params, tmp, _ = unlearned
    missing = params.model_copy(update={"unlearning": params.unlearning.model_copy(update={"out_dir": str(tmp / "none")})})
    corpus_dir = tmp / "corpus"
    if not corpus_dir.exists():
        write_corpus(p_corpus, corpus_dir)
    with pytest.raises(adapters.InjectionError, match="run `kbench unlearn`"):
        run_cell_stage(missing, CellSpec("P", "ga", 0, "lora"), corpus_dir=corpus_dir, index_dir=None,
                       out_root=tmp / "cells-missing", track=False, progress=False)


def test_the_leaderboard_shows_each_weight_method_budget():
    from types import SimpleNamespace

    from kbench.comparison.tables import shown_budget

    assert shown_budget(SimpleNamespace(unlearned=(), budget_exceptions=())) == ""  # trains nothing
    assert shown_budget(SimpleNamespace(unlearned=("m/ga/lora",), budget_exceptions=())) == "matched"
    declared = SimpleNamespace(unlearned=("m/o3/lora",), budget_exceptions=(("learning_rate", "a fresh adapter"),))
    assert shown_budget(declared) == "differs: learning_rate (a fresh adapter)"


# -- the probes stage on the same design ------------------------------------------------------
def test_the_probes_stage_reads_every_model_of_the_design(unlearned, p_corpus, kbench_root, caplog):
    from kbench.stages import probes as probes_stage

    params, tmp, _ = unlearned
    design = params.model_copy(update={
        "methods": [*params.methods, "gold", "star"],
        "probes": params.probes.model_copy(update={"out_dir": str(tmp / "probes"), "n_general": 2}),
    })
    summary = probes_stage.run_probes_stage(design, p_corpus, track=False)
    expected = {"agent-base", "lora-d"} | {f"P__{r}__{m}" for r in ("lora", "merged")
                                           for m in ("none", "gold", "ga", "o3", "o3-75", "star")}
    assert set(summary) == expected
    assert "output only" in summary["P__lora__star"]["not_applicable"]
    for key, entry in summary.items():
        if "not_applicable" in entry:
            continue
        folder = tmp / "probes" / key
        assert {"raw.json", "scores.json", "inputs.json", "run.json"} <= {p.name for p in folder.iterdir()}
        assert json.loads((folder / "run.json").read_text())["kind"] == "probe"
        assert set(entry["clean"]) == {"tofu", "muse_knowmem", "muse_verbmem", "muse_mia", "wmdp_mcq", "lume"}
    # every model is read against its recipe's gold: gold against itself is clean on TOFU
    assert summary["P__lora__gold"]["scores"]["forget_quality"] == 1.0
    assert summary["P__lora__gold"]["clean"]["tofu"] is True
    # o3-75 gates o3's unlearn LoRA differently from o3: the raw rows differ
    raw = {k: (tmp / "probes" / k / "raw.json").read_text() for k in ("P__lora__o3", "P__lora__o3-75", "P__lora__none")}
    assert raw["P__lora__o3"] != raw["P__lora__none"] and raw["P__lora__o3"] != raw["P__lora__o3-75"]
    # a rerun keeps every finished model and writes the same bytes
    before = (tmp / "probes" / "summary.json").read_bytes()
    with caplog.at_level("INFO"):
        probes_stage.run_probes_stage(design, p_corpus, track=False)
    assert caplog.text.count("finished earlier (kept)") == len(expected) - 2
    assert (tmp / "probes" / "summary.json").read_bytes() == before
    with pytest.raises(ValueError, match="unknown probed model"):
        probes_stage.run_probes_stage(design, p_corpus, track=False, only=["nope"])


def _queued_design(params, p_corpus, tmp: Path, section: str, out_dir: str, workers: str) -> tuple[Path, Path]:
    """A params file for a stage run through a pool of two workers (`section.out_dir` moved to
    `out_dir`, `execution.<workers>` 2), and the corpus folder the workers read."""
    import yaml

    corpus_dir = tmp / "corpus"
    if not corpus_dir.exists():
        write_corpus(p_corpus, corpus_dir)
    data = params.model_dump(mode="json")
    data[section]["out_dir"] = str(tmp / out_dir)
    data["execution"][workers] = 2
    params_file = tmp / f"params-{section}-queue.yaml"
    params_file.write_text(yaml.safe_dump(data))
    return params_file, corpus_dir


def test_the_probes_work_queue_writes_the_same_bytes_as_one_process(unlearned, p_corpus, kbench_root):
    """`kbench probes` through a pool of two workers (one thread each) against the in-process
    stage: every model's raw rows byte for byte, and the stage's MLflow runs logged."""
    import subprocess
    import sys

    from kbench.stages import probes as probes_stage

    params, tmp, _ = unlearned
    keys = ["agent-base", "P__lora__none", "P__lora__o3-75", "P__merged__ga"]
    one = params.model_copy(update={"probes": params.probes.model_copy(update={"out_dir": str(tmp / "probes-one"), "n_general": 2})})
    probes_stage.run_probes_stage(one, p_corpus, track=False, only=keys)
    params_file, corpus_dir = _queued_design(one, p_corpus, tmp, "probes", "probes-queue", "probe_workers")
    command = [sys.executable, "-m", "kbench.cli.main", "--params", str(params_file), "probes", "--corpus", str(corpus_dir)]
    for key in keys:
        command += ["--model", key]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("finished in") == len(keys)
    for key in keys:
        assert (tmp / "probes-queue" / key / "raw.json").read_bytes() == (tmp / "probes-one" / key / "raw.json").read_bytes()
    assert (kbench_root / "mlflow.db").exists()


def test_a_gated_hook_sees_the_rows_of_each_probe_batch(unlearned, p_corpus):
    """O3-75's per-query gate under the probes' batching: the same replies and scores whether
    the rows run in batches of 2 or all at once."""
    from kbench.agent import deployed_model
    from kbench.probes import ProbeRunner, probe_items
    from kbench.probes.run import _question_rows
    from kbench.stages.cell import deployment

    params, _, _ = unlearned
    spec = CellSpec("P", "o3-75", 0, "lora")
    deployed = deployment(params, spec)
    backend, method = deployed_model(params, p_corpus, deployed.model, substrate="P", method="o3-75", seed=0,
                                     adapter_path=str(deployed.adapter_path), unlearned=deployed.unlearned)
    items = probe_items(p_corpus, params)
    rows = [(q.query, q.prompt, "") for q in items.questions]
    scored = _question_rows(items.questions)
    runs = {}
    for size in (2, 64):
        runner = ProbeRunner(backend, method, params.probes.model_copy(update={"batch_size": size}))
        runs[size] = runner.generate(rows), runner.score(scored)
    assert runs[2][0] == runs[64][0]
    assert all(abs(a - b) < 1e-4 for x, y in zip(runs[2][1], runs[64][1]) for a, b in zip(x, y))
    assert any(method.gate(q.query) for q in items.questions) and not all(method.gate(q.query) for q in items.questions)


def test_the_unlearn_work_queue_writes_the_same_bytes_as_one_process(unlearned, p_corpus, kbench_root):
    """`kbench unlearn` through a pool of two workers (one thread each) against the in-process
    stage of the fixture: every adapter byte for byte, each run logged by the parent."""
    import subprocess
    import sys

    params, tmp, _ = unlearned
    params_file, corpus_dir = _queued_design(params, p_corpus, tmp, "unlearning", "unlearned-queue", "unlearn_workers")
    done = subprocess.run([sys.executable, "-m", "kbench.cli.main", "--params", str(params_file), "unlearn",
                           "--corpus", str(corpus_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [f"{m}/{r}" for r in params.p_recipes for m in ("ga", "o3")]
    assert sorted(line.split("unlearn ")[1].split(" finished")[0] for line in done.stderr.splitlines()
                  if " finished in " in line) == sorted(runs)
    for run in runs:
        weights = Path(run) / "adapter_model.safetensors"
        assert (tmp / "unlearned-queue" / weights).read_bytes() == (tmp / "unlearned" / weights).read_bytes()
    assert (kbench_root / "mlflow.db").exists()
