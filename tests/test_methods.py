"""The portable methods (ECO, StaR, LEACE, RepE, MLP-probe, R-LACE, noise) and the fit stage, on a
tiny random model: each hook changes what it claims to and only for the queries it should."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _agent_fixtures import index_dir, params, small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from _parametric_fixtures import one_thread  # noqa: F401  (fixture)

from kbench.agent.runner import setup_cell
from kbench.backends.hf import load_model
from kbench.config import ModelConfig, ParamsError, parse_params
from kbench.design import check_design
from kbench.methods import Fitted, MethodContext, MethodError, build_method
from kbench.methods.fitting import FIT_POOLS, Activations, load_fitted, name_positions
from kbench.methods.residual import residual_edit
from kbench.parametric import base_fingerprint
from kbench.records import FORGET, RETAIN, Entity
from kbench.stages.fit import fit_prompts, run_fit_stage

ACTIVATION_METHODS = ["leace", "repe", "mlp-probe", "r-lace", "noise"]
PORTABLE = ["eco", "star", *ACTIVATION_METHODS]


def _params(tmp_path, model_dir, **sections):
    data = {
        "model": {"path": str(model_dir)},
        "agent_base": {"enabled": False},
        "agent": {"max_iters": 2, "max_new_tokens": 8, "summary_max_new_tokens": 8, "batch_size": 4},
        "methods": ["none", *PORTABLE],
        "substrates": ["R-struct"],
        "fit": {"out_dir": str(tmp_path / "fitted")},
        "method_params": {name: {"layer": 1} for name in ACTIVATION_METHODS}
        | {"mlp-probe": {"layer": 1, "epochs": 30}, "r-lace": {"layer": 1, "rank": 2}},
        **sections,
    }
    return check_design(parse_params(data))


@pytest.fixture(scope="module")
def fitted_params(tmp_path_factory, tiny_model_dir, small_corpus):  # noqa: F811
    tmp = tmp_path_factory.mktemp("fit")
    p = _params(tmp, tiny_model_dir)
    results = run_fit_stage(p, small_corpus, track=False)
    return p, results


def _method(name, p, corpus):
    method = build_method(name, MethodContext(corpus, p, 0))
    if method.fits:
        method.load_fitted(load_fitted(p, name, base_fingerprint(p.model.path)))
    return method


# -- the fit stage ----------------------------------------------------------------------
def test_fit_prompts_read_adapter_pools_only(small_corpus, params):  # noqa: F811
    prompts = fit_prompts(small_corpus, params)
    pools = {eid: label for pool, label in FIT_POOLS.items() for eid in small_corpus.pools[pool]}
    assert {p.entity_id for p in prompts} == set(pools)
    assert all(p.label == pools[p.entity_id] for p in prompts)


def test_fit_ignores_evaluation_entities(tmp_path, tiny_model_dir, small_corpus):  # noqa: F811
    """Rewriting every evaluation entity (names, bios, values) leaves every fitted tensor as it was."""
    changed = dict(small_corpus.entities)
    for pool in ("forget_eval", "retain_eval"):
        for eid in small_corpus.pools[pool]:
            e = changed[eid]
            changed[eid] = e.model_copy(update={"name": "Zed " + e.name, "bio": "Altered. " + e.bio,
                                                "employer": "Other Corp"})
    other = dataclasses.replace(small_corpus, entities=changed)
    runs = {}
    for label, corpus in (("a", small_corpus), ("b", other)):
        p = _params(tmp_path / label, tiny_model_dir)
        run_fit_stage(p, corpus, track=False)
        runs[label] = {name: load_fitted(p, name, base_fingerprint(p.model.path)).tensors
                       for name in ["eco", *ACTIVATION_METHODS]}
    for name, tensors in runs["a"].items():
        for key, value in tensors.items():
            assert torch.equal(value, runs["b"][name][key]), (name, key)
    # byte for byte, every file of the two fit outputs (no timing or date in them)
    folders = [tmp_path / label / "fitted" for label in ("a", "b")]
    files = [{p.relative_to(f): p.read_bytes() for p in sorted(f.rglob("*")) if p.is_file()} for f in folders]
    assert files[0] == files[1] and len(files[0]) > 10
    # ...while rewriting an adapter-pool entity changes what is fitted
    eid = small_corpus.pools["forget_adapter"][0]
    changed[eid] = changed[eid].model_copy(update={"name": "Quentin Xylophone"})
    p = _params(tmp_path / "c", tiny_model_dir)
    run_fit_stage(p, dataclasses.replace(small_corpus, entities=changed), track=False)
    direction = load_fitted(p, "repe", base_fingerprint(p.model.path)).tensors["direction"]
    assert not torch.equal(direction, runs["a"]["repe"]["direction"])


def test_fit_writes_artifacts_and_diagnostics(fitted_params):
    p, results = fitted_params
    assert set(results) == set(PORTABLE)
    for name in PORTABLE:
        folder = p.fit.out_dir + "/" + name
        info = json.loads(open(folder + "/fit.json").read())
        assert info["method"] == name and info["base_fingerprint"]
        assert json.loads(open(folder + "/diagnostics.json").read()) == json.loads(json.dumps(results[name]))
    leace = results["leace"]
    assert {"erased_directions", "null_probe_effect", "probe_effect", "exceeds_null"} <= set(leace)
    assert 0 <= results["eco"]["learned_gate_heldout_accuracy"] <= 1


def test_cell_refuses_missing_or_foreign_fit(fitted_params, tmp_path, small_corpus):  # noqa: F811
    p, _ = fitted_params
    with pytest.raises(MethodError, match="fitted for base model"):
        load_fitted(p, "repe", "another-fingerprint")
    empty = parse_params({**p.model_dump(mode="json"), "fit": {"out_dir": str(tmp_path / "none")}})
    with pytest.raises(MethodError, match="no fitted artifact.*kbench fit"):
        load_fitted(empty, "repe", base_fingerprint(p.model.path))
    changed = parse_params({**p.model_dump(mode="json"), "method_params": {"repe": {"layer": 1, "alpha": 0.5}}})
    with pytest.raises(MethodError, match="rerun `kbench fit`"):
        load_fitted(changed, "repe", base_fingerprint(p.model.path))
    # an altered artifact is refused
    import shutil

    from kbench.io import IntegrityError

    copy = tmp_path / "copy"
    shutil.copytree(p.fit.out_dir, copy)
    weights = copy / "repe" / "fitted.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    altered = parse_params({**p.model_dump(mode="json"), "fit": {"out_dir": str(copy)}})
    with pytest.raises(IntegrityError, match="fitted.safetensors"):
        load_fitted(altered, "repe", base_fingerprint(p.model.path))


def test_method_params_are_checked(tmp_path, tiny_model_dir):  # noqa: F811
    with pytest.raises(ParamsError, match="method_params.repe.alpah"):
        _params(tmp_path, tiny_model_dir, method_params={"repe": {"alpah": 1}})
    with pytest.raises(ParamsError, match="unknown method.*'rep'"):
        _params(tmp_path, tiny_model_dir, method_params={"rep": {}})


# -- activation edits -------------------------------------------------------------------
def _synthetic(n=400, d=16, seed=0):
    """A concept linearly encoded along one direction, plus noise."""
    g = torch.Generator().manual_seed(seed)
    label = torch.arange(n) % 2
    x = torch.randn(n, d, generator=g)
    x[:, 3] += 3.0 * (2 * label - 1)
    return Activations(x=x, label=label, prompt=torch.arange(n))


def _probe(x, y):
    from sklearn.linear_model import LogisticRegression

    half = len(y) // 2
    return LogisticRegression(max_iter=2000).fit(x[:half].numpy(), y[:half].numpy()).score(x[half:].numpy(), y[half:].numpy())


def test_leace_makes_a_linear_probe_fall_to_chance(params, small_corpus):  # noqa: F811
    acts = _synthetic()
    method = build_method("leace", MethodContext(small_corpus, params, 0))
    method.load_fitted(Fitted(method.learn(acts)))
    assert _probe(acts.x, acts.label) > 0.95
    assert _probe(method.edit(acts.x[None])[0], acts.label) < 0.6


def test_rlace_removes_exactly_k_directions(params, small_corpus):  # noqa: F811
    acts = _synthetic(d=12)
    p = parse_params({"method_params": {"r-lace": {"rank": 3}}})
    method = build_method("r-lace", MethodContext(small_corpus, p, 0))
    method.load_fitted(Fitted(method.learn(acts)))
    projection = method.edit(torch.eye(12)[None])[0]  # rows: the map applied to the basis
    removed = torch.eye(12) - projection
    assert torch.linalg.matrix_rank(removed, atol=1e-5) == 3
    assert torch.allclose(projection @ projection, projection, atol=1e-5)  # a projection


def test_mlp_probe_gradient_is_the_autograd_gradient(params, small_corpus):  # noqa: F811
    acts = _synthetic()
    p = parse_params({"method_params": {"mlp-probe": {"epochs": 20}}})
    method = build_method("mlp-probe", MethodContext(small_corpus, p, 0))
    method.load_fitted(Fitted(method.learn(acts)))
    h = acts.x[:5].clone().requires_grad_(True)
    with torch.enable_grad():
        method.logit(h).sum().backward()
    assert torch.allclose(method.gradient(acts.x[:5]), h.grad, atol=1e-5)
    assert (method.logit(method.edit(acts.x)) < method.logit(acts.x)).float().mean() > 0.95


def test_noise_norm_equals_the_measured_edit_norm(fitted_params, small_corpus):  # noqa: F811
    p, results = fitted_params
    measured = results["noise"]["matched_edit_norms"]
    assert set(measured) == {"leace", "repe", "mlp-probe", "r-lace"}
    for name in measured:
        assert measured[name] == pytest.approx(results[name]["edit_norm"], rel=1e-5)
    target = sum(measured.values()) / len(measured)
    noise = _method("noise", p, small_corpus)
    h = torch.randn(2, 3, noise._shift.shape[0])
    assert (noise.edit(h) - h).norm(dim=-1) == pytest.approx(torch.full((2, 3), target), rel=1e-5)
    assert results["noise"]["edit_norm"] == pytest.approx(target, rel=1e-5)


@pytest.mark.parametrize("name", ACTIVATION_METHODS)
def test_activation_hooks_change_the_layer_output(name, fitted_params, small_corpus):  # noqa: F811
    p, _ = fitted_params
    model, tokenizer = load_model(p.model)
    method = _method(name, p, small_corpus)
    ids = torch.tensor([tokenizer("What is the date of birth?")["input_ids"]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with method.forward_hooks(_Backend(model, tokenizer), []):
            hooked = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert not torch.allclose(plain, hooked)
    assert torch.equal(plain, after)  # the hook is gone after the block


class _Backend:
    """What a forward hook reads off a backend."""

    def __init__(self, model, tokenizer, rows=None):
        self.model, self.tokenizer, self.batch_rows = model, tokenizer, rows


# -- ECO --------------------------------------------------------------------------------
def test_name_positions_cover_the_name(tiny_model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Question: What is Ann Lee's job? Ann Lee works.")["input_ids"]
    positions = name_positions(tokenizer, ids, "Ann Lee")
    covered = "".join(tokenizer.decode([ids[i]]) for i in positions)
    assert covered.count("Ann Lee") == 2
    assert "What" not in covered and "works" not in covered


def test_eco_oracle_corrupts_forget_rows_only(fitted_params, small_corpus):  # noqa: F811
    p, _ = fitted_params
    model, tokenizer = load_model(p.model)
    eco = _method("eco", p, small_corpus)
    forget = small_corpus.queries_for(small_corpus.pools["forget_eval"][0])[0]
    retain = small_corpus.queries_for(small_corpus.pools["retain_eval"][0])[0]
    assert eco.gate(forget) and not eco.gate(retain) and eco.fresh_prompt(forget)
    texts = [forget.question, retain.question]
    tokenizer.padding_side = "left"  # as the engine pads
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    embed = model.get_input_embeddings()
    seen = {}
    with torch.no_grad():
        with eco.forward_hooks(_Backend(model, tokenizer, (0, 1)), [forget, retain]):
            handle = embed.register_forward_hook(lambda m, a, out: seen.setdefault("e", out.clone()))  # after ECO's
            hooked = model(**encoded).logits
            handle.remove()
        plain = model(**encoded).logits
    clean = embed(encoded["input_ids"])
    changed = (seen["e"] != clean).any(-1)
    assert changed[0].any() and not changed[1].any()  # retain: bit-identical embeddings
    row = encoded["input_ids"][0].tolist()
    pad = int((encoded["attention_mask"][0] == 0).sum())
    names = name_positions(tokenizer, row[pad:], small_corpus.entities[forget.entity_id].name)
    assert set(changed[0].nonzero()[:, 0].tolist()) == {pad + k for k in names}
    assert torch.equal(hooked[1], plain[1]) and not torch.allclose(hooked[0], plain[0])


def test_eco_leaves_retain_trajectories_identical(fitted_params, small_corpus, index_dir, monkeypatch):  # noqa: F811
    """Retain trajectories are the baseline's; every generation of a forget query (each ReAct step,
    re-encoded whole, and the summary) has its name tokens corrupted."""
    import kbench.methods.eco as eco_module

    corrupted = []
    real = eco_module.name_positions
    monkeypatch.setattr(eco_module, "name_positions", lambda *a: corrupted.append(real(*a)) or corrupted[-1])
    p, _ = fitted_params
    items = [(q, RETAIN) for q in small_corpus.sample_queries(RETAIN, 3, 0)]
    items += [(q, FORGET) for q in small_corpus.sample_queries(FORGET, 3, 0)]
    records = {}
    for name in ("none", "eco"):
        agent = setup_cell(p, small_corpus, p.model, substrate="R-struct", method=name, seed=0, index_dir=index_dir,
                           fitted=load_fitted(p, name, base_fingerprint(p.model.path)) if name == "eco" else None)
        out = []
        agent.run(items, out.append)
        records[name] = {r.query_id: r for r in out}
    for q, split in items:
        a, b = records["none"][q.query_id], records["eco"][q.query_id]
        if split == RETAIN:
            assert a.model_dump(exclude={"method"}) == b.model_dump(exclude={"method"})
    forget_generations = sum(len(records["eco"][q.query_id].steps) + 1 for q, split in items if split == FORGET)
    assert len(corrupted) == forget_generations and all(corrupted)


# -- StaR -------------------------------------------------------------------------------
def test_star_redacts_thoughts_about_protected_entities(params, small_corpus):  # noqa: F811
    star = build_method("star", MethodContext(small_corpus, params, 0))
    forget = small_corpus.entities[small_corpus.pools["forget_eval"][0]]
    text = (f"Thought: {forget.bio}\nAction: lookup_record[{forget.name}]")
    filtered = star.filter_output(None, text)
    assert forget.bio.split(".")[0] not in filtered and "[redacted]" in filtered
    assert filtered.endswith(f"Action: lookup_record[{forget.name}]")  # actions are never touched
    kept = "Thought: I should call a tool to look this up.\nFinal Answer: 1990-01-01"
    assert star.filter_output(None, kept) == kept


def test_hooks_are_declared(params, small_corpus):  # noqa: F811
    hooks = {name: build_method(name, MethodContext(small_corpus, params, 0)).hooks for name in PORTABLE}
    assert hooks["star"] == {"output"}
    assert all(hooks[name] == {"forward"} for name in ["eco", *ACTIVATION_METHODS])


def test_a_method_without_weights_fits_without_a_model(tmp_path, small_corpus, tiny_model_dir, monkeypatch):  # noqa: F811
    """StaR's calibration reads no weights: the fit stage never loads the model for it."""
    import kbench.stages.fit as fit_stage

    monkeypatch.setattr(fit_stage, "load_model", lambda *a: pytest.fail("the model was loaded"))
    p = parse_params({"model": {"path": str(tiny_model_dir)}, "agent_base": {"enabled": False},
                      "methods": ["none", "star"], "fit": {"out_dir": str(tmp_path / "fitted")}})
    results = run_fit_stage(p, small_corpus, track=False)
    assert set(results) == {"star"} and 0 <= results["star"]["auc"] <= 1


def test_fitting_on_an_endpoint_is_refused_for_weight_methods(tmp_path, small_corpus):  # noqa: F811
    p = parse_params({"model": {"backend": "openai", "path": "served", "base_url": "http://127.0.0.1:1/v1"},
                      "agent_base": {"enabled": False}, "methods": ["none", "repe"],
                      "fit": {"out_dir": str(tmp_path / "fitted")}})
    with pytest.raises(MethodError, match="'repe' fits on model weights; the openai backend has none"):
        run_fit_stage(p, small_corpus, track=False)


def test_all_methods_runs_cells_side_by_side_with_the_traces_of_one_at_a_time(
    kbench_root, tiny_model_dir, small_corpus, index_dir  # noqa: F811
):
    """`kbench cell --all-methods`: every method of the design, two cells at a time on one
    thread each, gives the traces of each cell run alone on all threads; an unreachable method
    leaves a skip marker; the parent logs every cell to MLflow."""
    import mlflow
    import yaml

    from kbench import tracking
    from kbench.cli.main import main
    from kbench.corpus import write_corpus

    corpus_dir = kbench_root / "corpus"
    write_corpus(small_corpus, corpus_dir)
    p = _params(kbench_root, tiny_model_dir, methods=["none", "gold", "star", "repe"])
    run_fit_stage(p, small_corpus, track=False)
    params_file = kbench_root / "params.yaml"
    params_file.write_text(yaml.safe_dump(p.model_dump(mode="json")))
    common = ["--params", str(params_file), "cell", "--substrate", "R-struct", "--seed", "0",
              "--corpus", str(corpus_dir), "--index", str(index_dir), "--no-progress"]
    assert main([*common, "--all-methods", "--out-root", "side"]) == 0
    for method in ("none", "star", "repe"):
        assert main([*common, "--method", method, "--out-root", "alone", "--no-track"]) == 0
        side = (kbench_root / f"side/R-struct__s0/{method}/none/traces.jsonl").read_bytes()
        assert side == (kbench_root / f"alone/R-struct__s0/{method}/none/traces.jsonl").read_bytes(), method
    assert json.loads((kbench_root / "side/R-struct__s0/gold/skipped.json").read_text())["reason"]
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")
    assert sorted(r.data.tags[tracking.TAG_METHOD] for r in runs) == ["none", "repe", "star"]
