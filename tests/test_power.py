"""What the paired McNemar test can reach and detect (kbench.observer.power, `kbench power`):
the exact p, the smallest p and p_adj a number of pairs allows, the paper's §4.4 power figure,
and the n the shipped params comment says each verdict class needs."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from scipy.stats import binomtest

from kbench.cli.main import main
from kbench.config import load_params
from kbench.observer.power import (
    PairedDesign,
    PowerError,
    exact_p,
    exact_power,
    n_per_seed_needed,
    pairs_needed,
    simulated_power,
    smallest_p,
    smallest_p_adjusted,
)
from kbench.observer.statistics import benjamini_hochberg
from kbench.observer.verdicts import reachable_classes

REPO = Path(__file__).resolve().parents[1]
#: The smallest no-intervention OR(all) the paper reports for a deployed agent (R-text, §5.2),
#: and the low ends of its context and R-struct ranges: the §4.4 figure holds at each.
PAPER_BASELINES = (0.160, 0.270, 0.335)


def test_exact_p_is_scipys_two_sided_binomial_test():
    for d in range(31):
        for b in range(d + 1):
            expected = 1.0 if d == 0 else binomtest(b, d, 0.5).pvalue
            assert float(exact_p(b, d)) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_smallest_p_of_a_number_of_pairs():
    assert smallest_p(4) == 0.125 and smallest_p(0) == 1.0 and smallest_p(1) == 1.0
    assert smallest_p(4) == float(exact_p(4, 4))  # all four pairs discordant, one way
    assert pairs_needed(0.05) == 6 and pairs_needed(0.001) == 11
    assert smallest_p(5) >= 0.05 > smallest_p(6)
    assert n_per_seed_needed(0.001, 3) == 4 and n_per_seed_needed(0.05, 1) == 6


def _support(pairs: int) -> list[float]:
    """Every p the test of `pairs` pairs can give (any number discordant, either way)."""
    return sorted({float(exact_p(b, d)) for d in range(pairs + 1) for b in range(d + 1)})


def test_no_outcome_gives_a_smaller_p_adj_than_the_bound():
    pairs = {"a": 3, "b": 5, "c": 8}
    bound = smallest_p_adjusted(pairs)
    assert bound["c"] > smallest_p(8)  # the other tests cannot all be as small: BH raises it
    best = {k: 1.0 for k in pairs}
    for ps in itertools.product(*(_support(n) for n in pairs.values())):
        for key, p_adj in zip(pairs, benjamini_hochberg(list(ps))):
            best[key] = min(best[key], p_adj)
    assert best == pytest.approx(bound)
    # With as many pairs in every test, the bound is the test's own smallest p.
    assert smallest_p_adjusted({"x": 4, "y": 4, "z": 4}) == {"x": 0.125, "y": 0.125, "z": 0.125}


@pytest.mark.parametrize("or_none", PAPER_BASELINES)
def test_the_papers_power_figure(or_none):
    # §4.4: n = 200 per seed, 3 seeds pooled, a 30% relative reduction, ρ = 0.7, α = 0.05.
    design = PairedDesign(n=200, seeds=3, or_none=or_none, relative_reduction=0.3, rho=0.7, alpha=0.05)
    assert design.pairs == 600
    assert exact_power(design) > 0.95


def test_simulation_agrees_with_the_exact_sum_and_is_seeded():
    design = PairedDesign(n=40, seeds=3, or_none=0.3, relative_reduction=0.3, rho=0.5, alpha=0.05)
    exact = exact_power(design)
    assert 0.2 < exact < 0.9  # a design where the power is neither 0 nor 1
    simulated = simulated_power(design, 20000, seed=1)
    assert simulated == pytest.approx(exact, abs=0.015)
    assert simulated == simulated_power(design, 20000, seed=1)


def test_the_paired_model_by_hand():
    design = PairedDesign(n=10, seeds=1, or_none=0.5, relative_reduction=0.5, rho=0.0, alpha=0.05)
    assert design.discordant == pytest.approx((0.5 * 0.75, 0.25 * 0.5))  # independent pair
    # Four pairs can never reach p < 0.05, whatever the effect.
    certain = PairedDesign(n=4, seeds=1, or_none=0.9, relative_reduction=1.0, rho=0.0, alpha=0.05)
    assert exact_power(certain) == 0.0


def test_an_impossible_correlation_is_refused():
    # ρ = 0.7 between indicators of rates 0.682 and 0.477 would need P(both) > P(method).
    with pytest.raises(PowerError, match=r"rho 0.7 is not a possible correlation .* \[-0.714, 0.653\]"):
        PairedDesign(n=200, seeds=3, or_none=0.682, relative_reduction=0.3, rho=0.7, alpha=0.05)


def test_reachable_classes_follow_the_thresholds():
    assert reachable_classes(0.125) == ("K-SUP", "MF", "ambiguous")
    assert reachable_classes(0.01) == ("K-REF", "K-SUP", "MF", "ambiguous")
    assert reachable_classes(1e-4) == ("K-REF-inf", "K-REF", "K-SUP", "MF", "ambiguous")
    assert reachable_classes(0.001) == ("K-REF", "K-SUP", "MF", "ambiguous")  # needs p_adj < 0.001


def test_power_command(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params.yaml: the SPEC thresholds
    argv = ["power", "--n", "200", "--seeds", "3", "--or-none", "0.16", "--relative-reduction", "0.3",
            "--rho", "0.7", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 600 and report["power"] > 0.95 and report["method"] == "exact"
    assert main(["power", "--n", "4", "--seeds", "1", "--or-none", "0.75", "--relative-reduction", "1",
                 "--rho", "0", "--simulations", "500", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert "smallest p with 4 pairs: 0.125; reachable K-classes: K-SUP, MF, ambiguous" in text
    assert "K-REF needs n >= 6 per seed and K-REF-inf n >= 11" in text
    assert main(["power", "--n", "200", "--seeds", "3", "--or-none", "0.682", "--relative-reduction",
                 "0.3", "--rho", "0.7"]) == 2
    assert "kbench power: error: rho 0.7 is not a possible correlation" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["params.yaml", "presets/cpu.yaml", "presets/cpu-full.yaml", "presets/paper.yaml"])
def test_the_params_comment_states_the_n_each_class_needs(name):
    path = REPO / name
    params = load_params(path)
    text = path.read_text()
    found = re.search(r"K-REF needs n_per_split >= (\d+) and K-REF-inf n_per_split >= (\d+)", text)
    assert found, f"{name} has no comment with the n each verdict class needs"
    seeds, config = len(params.seeds), params.scoring
    assert int(found[1]) == n_per_seed_needed(config.significance, seeds)
    assert int(found[2]) == n_per_seed_needed(config.kref_inf_p, seeds)
    reachable = re.search(r"reachable at this n: ([A-Za-z, -]+?)[.;]", text)
    lowest = smallest_p(params.queries.n_per_split * seeds)
    assert reachable and reachable[1].split(", ") == list(reachable_classes(lowest, config))
