"""docs/definitions.md §7: paired McNemar, Benjamini–Hochberg families, TV distance, τ, η²."""

import pandas as pd
import pytest
from _hash_seed import run_under_hash_seeds
from _traces import leaking, trace
from scipy.stats import binomtest

from kbench.observer.metrics import score_queries
from kbench.observer.statistics import (
    adjust_by_split,
    benjamini_hochberg,
    eta_squared,
    paired_mcnemar,
    substrate_separation,
    tau_threshold,
    tv_distance,
)


def cell(leaks, *, seed=0, method="none", first=0):
    """One record per entry of `leaks` (True: the answer leaks), queries numbered from `first`."""
    return score_queries(
        [
            leaking("Z_answer", query=first + i, seed=seed, method=method)
            if leaked
            else trace(query=first + i, seed=seed, method=method)
            for i, leaked in enumerate(leaks)
        ]
    )


def test_mcnemar_counts_discordant_pairs_and_matches_binomtest():
    baseline = cell([True] * 8 + [False] * 2)
    method = cell([False] * 6 + [True] * 2 + [True] + [False])
    result = paired_mcnemar(baseline, method)
    assert (result.pairs, result.baseline_only, result.method_only) == (10, 6, 1)
    assert result.p == pytest.approx(binomtest(6, 7, 0.5).pvalue)


def test_mcnemar_p_is_one_without_discordant_pairs():
    assert paired_mcnemar(cell([True, False]), cell([True, False], method="m")).p == 1.0


def test_mcnemar_pools_seeds_and_pairs_by_seed_and_query():
    baseline = score_queries(
        [leaking("Z_answer", query=0, seed=s) for s in (0, 137, 271)]
    )
    method = score_queries([trace(query=0, seed=s, method="m") for s in (0, 137, 271)])
    result = paired_mcnemar(baseline, method)
    assert (result.pairs, result.baseline_only) == (3, 3)
    assert result.p == pytest.approx(binomtest(3, 3, 0.5).pvalue)  # 0.25


def test_unpaired_queries_are_counted_and_left_out():
    baseline = cell([True, True, True])
    method = cell([False], method="m", first=2)  # only query 2 has a partner
    method_extra = cell([True, False], method="m", first=2)  # query 3 has none
    result = paired_mcnemar(baseline, method)
    assert (result.pairs, result.unpaired_baseline, result.unpaired_method) == (1, 2, 0)
    result = paired_mcnemar(baseline, method_extra)
    assert (result.pairs, result.unpaired_method) == (1, 1)


def test_a_duplicated_pairing_key_is_refused():
    twice = score_queries([trace(query=0), trace(query=0)])
    with pytest.raises(ValueError, match="seed 0, query_id pii-00000::occupation"):
        paired_mcnemar(twice, cell([True]))


def test_benjamini_hochberg_on_a_known_vector():
    # p_(i) * m / i = 0.004, 0.02, 0.02667, 0.5; already monotone.
    assert benjamini_hochberg([0.01, 0.001, 0.5, 0.02]) == pytest.approx([0.02, 0.004, 0.5, 0.026666667])
    # A step-up case: 0.04 * 2 / 1 = 0.08 is lowered to the next rank's 0.045 * 2 / 2.
    assert benjamini_hochberg([0.04, 0.045]) == pytest.approx([0.045, 0.045])
    assert benjamini_hochberg([0.3]) == [0.3]
    assert benjamini_hochberg([]) == []


def test_forget_and_retain_are_separate_families():
    tests = {("C", "a", "forget"): 0.01, ("C", "b", "forget"): 0.04, ("C", "a", "retain"): 0.01}
    adjusted = adjust_by_split(tests)
    assert adjusted[("C", "a", "forget")] == pytest.approx(0.02)
    assert adjusted[("C", "b", "forget")] == pytest.approx(0.04)
    assert adjusted[("C", "a", "retain")] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="unknown split"):
        adjust_by_split({("C", "a", "holdout"): 0.1})


def test_tv_distance_is_the_same_float_under_every_string_hash_seed():
    """The sum's order must not follow PYTHONHASHSEED: two runs of one design gave TVs one
    ulp apart in comparison.json when the channels were summed in a set's order."""
    # Summed in some orders these shares give 1.0851063829787235, in others ...233.
    code = (
        "from kbench.observer.statistics import tv_distance\n"
        "names = ['Z_CoT', 'Z_tool', 'Z_RAG', 'Z_answer', 'Z_summary', 'Z_tool_wide']\n"
        "a = {c: n / 47 for c, n in zip(names, [8, 36, 4, 16, 7, 31])}\n"
        "b = {c: n / 47 for c, n in zip(names, [28, 30, 41, 24, 13, 6])}\n"
        "print(repr(tv_distance(a, b)))\n"
    )
    outputs = set(run_under_hash_seeds(code, range(12)).values())
    assert len(outputs) == 1, outputs


def test_tv_distance_is_half_the_l1_distance_with_nulls_as_zero():
    assert tv_distance({"Z_answer": 1.0, "Z_CoT": 0.0}, {"Z_answer": 0.25, "Z_CoT": 0.75}) == 0.75
    assert tv_distance({"Z_answer": 1.0, "Z_RAG": None}, {"Z_answer": 0.5, "Z_RAG": 0.5}) == 0.5


def test_tau_is_twice_the_largest_mean_between_seed_tv():
    by_seed = {
        "C": [{"a": 1.0, "b": 0.0}, {"a": 0.9, "b": 0.1}, {"a": 0.8, "b": 0.2}],  # TVs .1 .2 .1
        "P": [{"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}],
        "R-text": [{"a": 1.0, "b": 0.0}],  # one seed: no between-seed TV
    }
    assert tau_threshold(by_seed, factor=2.0) == pytest.approx(2 * (0.4 / 3))
    assert tau_threshold({"C": [{"a": 1.0}]}, factor=2.0) is None


def test_substrate_separation_flags_exempt_pair():
    shares = {"C": {"a": 1.0}, "R-text": {"b": 1.0}, "R-struct": {"b": 0.9, "a": 0.1}}
    result = {(r.first, r.second): r for r in substrate_separation(shares, 0.3, [("R-text", "R-struct")])}
    assert result[("C", "R-struct")].separated and result[("C", "R-text")].separated
    pair = result[("R-struct", "R-text")]
    assert pair.exempt and not pair.separated and pair.tv == pytest.approx(0.1)


def test_eta_squared_balanced_design():
    frame = pd.DataFrame(
        {
            "k_score": [0.1, 0.1, 0.9, 0.9, 0.1, 0.1, 0.9, 0.9],
            "method": ["a", "a", "b", "b", "a", "a", "b", "b"],
            "substrate": ["C", "P", "C", "P", "C", "P", "C", "P"],
            "scoring_rule": ["binary"] * 8,
        }
    )
    eta = eta_squared(frame, "k_score", ["method", "substrate", "scoring_rule"])
    assert eta == pytest.approx({"method": 1.0, "substrate": 0.0, "scoring_rule": 0.0}, abs=1e-12)


def test_eta_squared_unbalanced_divides_by_the_direct_total_ss():
    y = [0.0, 0.2, 0.4, 1.0, 0.7, 0.3]
    group = ["a", "a", "a", "b", "b", "c"]
    frame = pd.DataFrame({"k": y + [None], "m": group + ["c"]})
    mean = sum(y) / len(y)
    total = sum((v - mean) ** 2 for v in y)
    means = {g: sum(v for v, h in zip(y, group) if h == g) / group.count(g) for g in set(group)}
    between = sum(group.count(g) * (means[g] - mean) ** 2 for g in means)
    assert eta_squared(frame, "k", ["m"])["m"] == pytest.approx(between / total)


def test_eta_squared_names_a_missing_column():
    with pytest.raises(ValueError, match="base_model"):
        eta_squared(pd.DataFrame({"k": [1.0]}), "k", ["base_model"])


def test_eta_squared_matches_a_type_two_anova_on_an_unbalanced_two_factor_design():
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    frame = pd.DataFrame(
        {
            "k": [0.1, 0.3, 0.8, 0.9, 0.2, 0.75, 0.4, 0.65, 0.5],
            "method": ["a", "a", "b", "b", "a", "b", "c", "c", "c"],
            "substrate": ["C", "P", "C", "P", "P", "C", "C", "P", "P"],
        }
    )
    table = anova_lm(smf.ols("k ~ C(method) + C(substrate)", data=frame).fit(), typ=2)
    total = float(((frame.k - frame.k.mean()) ** 2).sum())
    eta = eta_squared(frame, "k", ["method", "substrate"])
    assert eta["method"] == pytest.approx(table.loc["C(method)", "sum_sq"] / total)
    assert eta["substrate"] == pytest.approx(table.loc["C(substrate)", "sum_sq"] / total)


def test_eta_squared_of_a_saturated_design_with_confounded_factors():
    # One seed: every (substrate, recipe) cell appears once, and the recipe is fixed by the
    # substrate except on P. Substrate and recipe share the P split, so neither has a unique
    # share of it; what substrate explains beyond recipe is the C vs R-text difference.
    frame = pd.DataFrame(
        {
            "k": [0.2, 0.6, 0.5, 0.4],
            "substrate": ["C", "R-text", "P", "P"],
            "recipe": ["none", "none", "lora", "merged"],
        }
    )
    eta = eta_squared(frame, "k", ["substrate", "recipe"])
    mean = 0.425
    total = sum((v - mean) ** 2 for v in [0.2, 0.6, 0.5, 0.4])
    assert eta["substrate"] == pytest.approx(((0.2 - 0.4) ** 2 + (0.6 - 0.4) ** 2) / total)
    assert eta["recipe"] == pytest.approx(((0.5 - 0.45) ** 2 + (0.4 - 0.45) ** 2) / total)
