"""The probes: scores against hand computations and the reference libraries, items from the
design, and every probe on a tiny model with a planted memorized record against the same model
without it."""

from __future__ import annotations

import math
import random

import pytest
from _agent_fixtures import tiny_model_dir  # noqa: F401  (fixture)
from _parametric_fixtures import learner_dir, one_thread, p_corpus  # noqa: F401  (fixtures)
from scipy import stats

from kbench.backends import build_backend, hf
from kbench.config import CorpusConfig, LoraConfig, ModelConfig, Params, parse_params
from kbench.corpus import generate_corpus
from kbench.methods import MethodContext, build_method
from kbench.parametric import injection
from kbench.parametric.lora import tokenize_chat, train_lora
from kbench.probes import (
    ProbeRunner,
    above_chance,
    auc,
    clean_verdicts,
    forget_quality,
    harmonic_mean,
    mcq_choice,
    members_higher,
    min_k_percent,
    normalized_probability,
    privleak,
    probe_items,
    rouge_l_f1,
    run_probes,
    scores,
    truth_ratio,
)
from kbench.probes.items import GENERAL, HELDOUT, design_queries


def test_rouge_l_agrees_with_a_hand_computation():
    # LCS of "the cat sat on the mat" and "the cat lay on a mat" is "the cat on mat": 4 words
    p, r = 4 / 6, 4 / 6
    assert rouge_l_f1("the cat sat on the mat", "The cat lay on a mat.") == pytest.approx(2 * p * r / (p + r))
    # "police officer" vs "retired police officer at Acme": LCS 2, precision 2/5, recall 1
    assert rouge_l_f1("police officer", "retired police officer at Acme") == pytest.approx(2 * 0.4 * 1 / 1.4)
    assert rouge_l_f1("a b c", "x y z") == 0.0 and rouge_l_f1("", "x") == 0.0
    assert rouge_l_f1("Jane Doe, 12 Main St.", "jane doe 12 main st") == 1.0


def test_auc_agrees_with_scikit_learn_on_known_and_random_inputs():
    from sklearn.metrics import roc_auc_score

    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0 and auc([0.1], [0.9]) == 0.0 and auc([0.5], [0.5]) == 0.5
    rng = random.Random(0)
    members = [rng.gauss(0.5, 1) for _ in range(40)]
    non = [rng.gauss(0, 1) for _ in range(50)] + members[:3]  # with ties
    expected = roc_auc_score([1] * len(members) + [0] * len(non), members + non)
    assert auc(members, non) == pytest.approx(expected)


def test_forget_quality_is_scipys_two_sample_ks_p_value():
    a, b = [0.1, 0.4, 0.35, 0.8, 0.9], [0.5, 0.55, 0.6, 0.95, 1.2, 1.4]
    assert forget_quality(a, b) == pytest.approx(stats.ks_2samp(a, b).pvalue)
    assert forget_quality(a, a) == pytest.approx(1.0)
    far = forget_quality([0.01 * i for i in range(30)], [10 + 0.01 * i for i in range(30)])
    assert far < 1e-6


def test_truth_ratio_normalized_probability_and_harmonic_mean():
    assert normalized_probability([math.log(0.5), math.log(0.125)]) == pytest.approx(0.25)
    assert truth_ratio(0.5, [0.25, 0.0625]) == pytest.approx(0.125 / 0.5)  # geometric mean 0.125
    assert truth_ratio(0.2, [0.2, 0.2]) == pytest.approx(1.0)
    assert harmonic_mean([0.5, 0.5]) == pytest.approx(0.5)
    assert harmonic_mean([1.0, 0.25]) == pytest.approx(0.4) and harmonic_mean([0.9, 0.0]) == 0.0
    with pytest.raises(ValueError):
        truth_ratio(0.0, [0.1])


def test_min_k_privleak_and_mcq_choice():
    logprobs = [-0.1, -5.0, -0.2, -3.0, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8]
    assert min_k_percent(logprobs, 0.2) == pytest.approx((-5.0 - 3.0) / 2)
    assert min_k_percent([-1.0], 0.2) == -1.0  # at least one token
    assert privleak(0.9, 0.5) == pytest.approx(80.0) and privleak(0.5, 0.5) == 0.0
    assert mcq_choice([-3.0, -1.0, -2.0, -1.0]) == 1


def test_mcq_accuracy_of_random_scores_is_near_chance():
    rng = random.Random(1)
    picks = [mcq_choice([rng.random() for _ in range(4)]) for _ in range(4000)]
    assert sum(p == 0 for p in picks) / len(picks) == pytest.approx(0.25, abs=0.03)


def test_binomial_and_mann_whitney_tests_agree_with_scipy():
    assert above_chance(5, 6, 0.25) == pytest.approx(stats.binomtest(5, 6, 0.25, alternative="greater").pvalue)
    assert above_chance(0, 6, 0.25) == pytest.approx(1.0)
    members, others = [3.0, 2.5, 2.0, 4.0], [1.0, 0.5, 2.2]
    assert members_higher(members, others) == pytest.approx(
        stats.mannwhitneyu(members, others, alternative="greater").pvalue)


# -- the probes on a model --------------------------------------------------------------------
def _probe_params(**probes) -> Params:
    return parse_params({"queries": {"n_per_split": 2, "fields": ["occupation"]}, "agent_base": {"enabled": False},
                         "injection": {"adapter_pool_entities": 1}, "probes": {"batch_size": 8, "n_general": 4, **probes}})


def test_probe_items_come_from_the_design(p_corpus):
    params = _probe_params()
    items = probe_items(p_corpus, params)
    asked = design_queries(p_corpus, params)
    assert [q.query for q in items.questions] == asked["forget"] + asked["retain"]
    for q in items.questions:
        entity = p_corpus.entities[q.query.entity_id]
        assert q.value == entity.value(q.query.field)
        assert entity.name in q.stem
        others = list(q.perturbed)
        assert len(set(others)) == 3 and q.value not in others
        assert q.candidates() == [(q.stem, v) for v in (q.value, *others)]
        assert all(any(e.value("occupation") == v for e in p_corpus.entities.values()) for v in others)
    assert probe_items(p_corpus, params) == items  # seeded by the query ids
    heldout = [b for b in items.bios if b.group == HELDOUT]
    learned = {e for ids in injection.training_entities(p_corpus, params).values() for e in ids}
    assert heldout and not {b.query.entity_id for b in heldout} & learned
    assert len(heldout) == sum(b.group == "forget" for b in items.bios)
    for b in items.bios:
        assert f"{b.prefix} {b.rest}" == " ".join(b.text.split())
    assert [g.group for g in items.general] == [GENERAL] * 4


def _memorized_records(items) -> list[list[dict]]:
    """Chats teaching the forget questions' answers and the forget entities' bios."""
    chats = []
    for q in items.questions:
        if q.group == "forget":
            chats.append([*q.prompt, {"role": "assistant", "content": f"{q.stem} {q.value}."}])
    chats += [[*b.prompt, {"role": "assistant", "content": b.text}] for b in items.bios if b.group == "forget"]
    return chats


@pytest.fixture(scope="module")
def planted_probes(p_corpus, learner_dir, tmp_path_factory):
    """The probes' raw rows on the tiny learner with and without a LoRA that memorized the
    forget entities' answers and bios."""
    params = _probe_params(max_new_tokens=48, verbmem_words=12)
    items = probe_items(p_corpus, params)
    model, tokenizer = hf.load_model(ModelConfig(path=str(learner_dir)))
    examples = [tokenize_chat(tokenizer, chat, 256) for chat in _memorized_records(items)]
    run = train_lora(model, examples, LoraConfig(rank=16, alpha=32, epochs=60, batch_size=8, micro_batch_size=8,
                                                 learning_rate=1e-2))
    adapter = tmp_path_factory.mktemp("probe-adapter")
    run.model.save_pretrained(adapter)
    method = build_method("none", MethodContext(p_corpus, params, seed=0))
    raws = {}
    for name in ("base", "planted"):
        backend = build_backend(ModelConfig(path=str(learner_dir)))
        if name == "planted":
            backend.load_adapter(str(adapter))
        raws[name] = run_probes(ProbeRunner(backend, method, params.probes), items)
    return params, raws


def test_every_probe_moves_the_right_way_on_a_planted_record(planted_probes):
    params, raws = planted_probes
    base, planted = (scores(raws[k], params.probes) for k in ("base", "planted"))
    assert planted["probability.forget"] > base["probability.forget"] + 0.3  # TOFU: the answer is likelier
    assert planted["truth_ratio.forget"] < base["truth_ratio.forget"]  # and preferred over perturbed ones
    assert planted["knowmem.forget"] > base["knowmem.forget"] + 0.15  # MUSE: the reply states the value
    assert planted["verbmem.forget"] > base["verbmem.forget"] + 0.3  # and the bio is reproduced
    assert planted["auc"] > base["auc"] and planted["auc"] == 1.0  # Min-K% separates members
    assert planted["mcq.forget"] == 1.0  # the forced choice picks the truth
    assert planted["exact_match.forget"] > base["exact_match.forget"]  # LUME
    gold_like = scores(raws["base"], params.probes, gold=raws["base"])
    against = scores(raws["planted"], params.probes, gold=raws["base"])
    assert gold_like["forget_quality"] == 1.0 and against["forget_quality"] < gold_like["forget_quality"]
    assert against["privleak"] > 0 and gold_like["privleak"] == 0.0
    verdicts = clean_verdicts(against, gold_like, params.probes.clean)
    assert verdicts["muse_knowmem"] is False and verdicts["muse_verbmem"] is False and verdicts["lume"] is False
    assert all(clean_verdicts(gold_like, gold_like, params.probes.clean)[p] for p in ("muse_knowmem", "muse_verbmem", "lume", "tofu"))


def test_the_raw_rows_hold_every_query_and_bio(planted_probes):
    params, raws = planted_probes
    raw = raws["planted"]
    assert {r["group"] for r in raw["questions"]} == {"forget", "retain"}
    assert all(len(r["perturbed"]) == params.probes.n_perturbed and r["reply"] is not None for r in raw["questions"])
    assert {b["group"] for b in raw["bios"] if "logprobs" in b} == {"forget", HELDOUT}
    assert {b["group"] for b in raw["bios"] if "continuation" in b} == {"forget", "retain"}


def test_mcq_accuracy_of_a_random_model_is_near_chance(tiny_model_dir):
    """Many forced-choice items on a random-weight model: the truth and the perturbed options
    are values of the same field drawn alike, so accuracy sits at 1 / 4."""
    corpus = generate_corpus(CorpusConfig(n_entities=200))
    params = parse_params({"queries": {"n_per_split": 100}, "agent_base": {"enabled": False},
                           "injection": {"adapter_pool_entities": 1}, "probes": {"batch_size": 64}})
    items = probe_items(corpus, params)
    runner = ProbeRunner(build_backend(ModelConfig(path=str(tiny_model_dir))),
                         build_method("none", MethodContext(corpus, params, seed=0)), params.probes)
    rows = [(q.query, q.prompt, stem, text) for q in items.questions for stem, text in q.candidates()]
    logprobs = runner.score(rows)
    picks = [mcq_choice([sum(o) / len(o) for o in logprobs[i * 4 : i * 4 + 4]]) for i in range(len(items.questions))]
    assert len(picks) >= 150
    assert sum(p == 0 for p in picks) / len(picks) == pytest.approx(0.25, abs=0.1)


def test_a_model_without_the_kv_engine_is_probed_row_by_row_to_the_engines_numbers(tiny_model_dir):  # noqa: F811
    """`model.engine: generate` (as a sliding-window model falls back to): the probes score and
    continue each row alone with plain forward passes and `generate`, which give what the engine
    gives on a model it can hold."""
    corpus = generate_corpus(CorpusConfig(n_entities=40))
    params = parse_params({"queries": {"n_per_split": 2}, "agent_base": {"enabled": False},
                           "injection": {"adapter_pool_entities": 1}, "probes": {"max_new_tokens": 8}})
    items = probe_items(corpus, params)
    method = build_method("none", MethodContext(corpus, params, seed=0))
    engine = ProbeRunner(build_backend(ModelConfig(path=str(tiny_model_dir))), method, params.probes)
    alone = ProbeRunner(build_backend(ModelConfig(path=str(tiny_model_dir), engine="generate")), method, params.probes)
    assert engine.backend.session() is not None and alone.backend.session() is None
    rows = [(q.query, q.prompt, stem, text) for q in items.questions[:4] for stem, text in q.candidates()]
    for by_engine, by_row in zip(engine.score(rows), alone.score(rows)):
        assert by_row == pytest.approx(by_engine, abs=1e-4)
    prompts = [(q.query, q.prompt, "") for q in items.questions[:4]]
    assert alone.generate(prompts) == engine.generate(prompts)
