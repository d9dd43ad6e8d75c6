"""The comparison's numbers and tables on a small design with answers computed by hand
(tests/_comparison_cells.py describes it): verdicts, BH families, leaderboards, verdict
matrix, attacker-budget flips, leak-pattern TV and τ, η², LoRA-D controls, missing baselines."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from _comparison_cells import BASELINE_RETAIN, cell_run, design

from kbench.comparison.analysis import DESIGN_FACTORS, RowKey, compare, sensitivity
from kbench.comparison.collect import CellRunInfo, latest_per_key
from kbench.comparison.plots import k_score_frame, selectivity_frame
from kbench.comparison.tables import (
    attacker_budget_table,
    budget_verdict_table,
    leaderboards,
    separation_table,
    verdict_matrix,
)


@pytest.fixture(scope="module")
def comparison():
    return compare(design())


def row(comparison, substrate, method, recipe="none"):
    (found,) = [r for r in comparison.rows if r.key == RowKey("tiny", substrate, recipe, method)]
    return found


def column(table, name):
    index = table.columns.index(name)
    return [r[index] for r in table.rows]


def test_verdicts_of_the_design(comparison):
    verdicts = {(r.key.substrate, r.key.method): r.verdict.verdict for r in comparison.rows}
    assert verdicts == {
        ("C", "none"): "MF",  # what decide_verdict says of the reference; tables show "baseline"
        ("C", "eraser"): "K-REF-inf",
        ("C", "halver"): "K-REF",
        ("C", "migrator"): "K-SUP",
        ("C", "collapser"): "TC",
        ("R-struct", "none"): "MF",
        ("R-struct", "eraser"): "K-REF-inf",
        ("R-struct", "hider"): "K-REF",
        ("R-text", "none"): "invalid-baseline",
        ("R-text", "eraser"): "invalid-baseline",
    }
    migrator = row(comparison, "C", "migrator")
    assert (migrator.verdict.dominant_none, migrator.verdict.dominant_method) == ("Z_answer", "Z_summary")
    assert migrator.verdict.delta_sel == pytest.approx(-0.05) and not migrator.verdict.d1


def test_k_scores_by_hand(comparison):
    # none: 1 − OR̄ = 1 − 0.8; halver: 1 − 0.3; migrator: (1 − 0.8)(1 − |−0.05|); eraser: 1.
    expected = {("C", "none"): 0.2, ("C", "halver"): 0.7, ("C", "migrator"): 0.19, ("C", "eraser"): 1.0,
                ("R-struct", "none"): 0.0, ("R-struct", "hider"): 0.5}
    for (substrate, method), k in expected.items():
        assert row(comparison, substrate, method).verdict.k_score == pytest.approx(k)
    assert row(comparison, "C", "collapser").verdict.k_score is None


def test_benjamini_hochberg_over_every_method_row_by_hand(comparison):
    # Forget family: 7 method rows. Sorted p: R-struct eraser 2·½⁴⁰, C eraser and collapser
    # 2·½³², halver and hider 2·½²⁰, R-text eraser ½ (2 discordant pairs), migrator 1.
    halver = row(comparison, "C", "halver")
    assert halver.verdict.p == pytest.approx(2 * 0.5**20)
    assert halver.verdict.p_adj == pytest.approx(2 * 0.5**20 * 7 / 5)
    assert row(comparison, "R-text", "eraser").verdict.p_adj == pytest.approx(0.5 * 7 / 6)
    assert row(comparison, "C", "migrator").verdict.p_adj == 1.0
    # Retain family: only the migrator's retain differs (one pair per seed), p = ½, alone
    # among six tests with p = 1 it is adjusted to min(½ · 7, 1).
    assert row(comparison, "C", "migrator").test_retain.p == pytest.approx(0.5)
    assert row(comparison, "C", "migrator").p_adj_retain == 1.0
    # The reference is no test.
    assert row(comparison, "C", "none").verdict.p_adj == 1.0


def test_leaderboard_sorted_by_k_score_with_tc_shown_as_tc(comparison):
    tables = {t.title: t for t in leaderboards(comparison)}
    assert list(tables) == ["tiny · C", "tiny · R-struct", "tiny · R-text"]
    c = tables["tiny · C"]
    assert column(c, "Method") == ["eraser", "halver", "none", "migrator", "collapser"]
    assert column(c, "K-Score") == ["1.000", "0.700", "0.200", "0.190", "TC"]
    assert column(c, "Verdict") == ["K-REF-inf", "K-REF", "baseline", "K-SUP", "TC"]
    assert column(c, "D1")[3] == "no" and column(c, "Δsel")[3] == "-0.050"
    assert column(c, "Runs")[0] == "tiny-C-none-eraser-s0 tiny-C-none-eraser-s137"
    assert column(c, "Baseline runs")[0] == "tiny-C-none-none-s0 tiny-C-none-none-s137"
    assert column(c, "CER Z_summary")[3].startswith("0.800 [")
    assert column(tables["tiny · R-text"], "K-Score") == ["—", "—"]
    # The K-Score plot data keeps TC as TC, never as a bar at 0.
    frame = k_score_frame(comparison)
    collapser = frame[frame["method"] == "collapser"].iloc[0]
    assert collapser["shown"] == "TC" and pd.isna(collapser["k_score"])


def test_verdict_matrix(comparison):
    matrix = verdict_matrix(comparison)
    assert matrix.columns == ("Method", "tiny · C", "tiny · R-struct", "tiny · R-text")
    cells = {r[0]: r[1:] for r in matrix.rows}
    assert list(cells) == ["none", "collapser", "eraser", "halver", "hider", "migrator"]
    assert cells["none"] == ("baseline", "baseline", "invalid-baseline")
    assert cells["eraser"] == ("K-REF-inf", "K-REF-inf", "invalid-baseline")
    assert cells["migrator"] == ("K-SUP", "", "")
    assert "ga" not in cells  # no baseline, so no verdict


def test_attacker_budgets_and_flips(comparison):
    table = attacker_budget_table(comparison)
    by_substrate = {r[1]: r for r in table.rows}
    assert by_substrate["C"][2:8] == ("0.800",) * 5 + ("1 / 4",)
    assert by_substrate["R-struct"][2:8] == ("0.500",) + ("1.000",) * 4 + ("1 / 2",)
    assert by_substrate["R-text"][7] == "0 / 1"
    # The migrator hides from an answer-only attacker; the hider only looks partial to one.
    assert row(comparison, "C", "migrator").by_budget["A1"].verdict == "K-REF-inf"
    assert row(comparison, "R-struct", "hider").by_budget["A1"].verdict == "MF"
    flipped = {r[2] for r in budget_verdict_table(comparison).rows if r[-1] == "flips"}
    assert flipped == {"migrator", "hider"}
    # A5 is the full observer: its verdict is the headline verdict.
    for result in comparison.rows:
        if result.by_budget:
            assert result.by_budget["A5"].verdict == result.verdict.verdict


def test_leak_patterns_tv_and_tau_by_hand(comparison):
    (patterns,) = comparison.leak_patterns
    # C's seeds: shares (answer 1) and (answer 0.8, summary 0.2): between-seed TV 0.2, the
    # largest, so τ = 2 · 0.2. Pooled C shares: answer 8/9, summary 1/9; R-struct ½, ½;
    # R-text answer 1.
    assert patterns.tau == pytest.approx(0.4)
    tv = {(p.first, p.second): p for p in patterns.pairs}
    assert tv["C", "R-struct"].tv == pytest.approx(7 / 18) and not tv["C", "R-struct"].separated
    assert tv["C", "R-text"].tv == pytest.approx(1 / 9) and not tv["C", "R-text"].separated
    assert tv["R-struct", "R-text"].tv == pytest.approx(0.5) and tv["R-struct", "R-text"].exempt
    assert patterns.hypothesis_holds is False
    table = separation_table(patterns, 2.0)
    assert column(table, "TV > τ") == ["no", "no", "yes"]
    assert column(table, "Exempt") == ["", "", "exempt"]
    assert [s.invalid for s in patterns.substrates] == [False, False, True]


def test_tau_is_undefined_with_one_seed():
    cells = [c for c in design() if c.seed == 0]
    (patterns,) = compare(cells).leak_patterns
    assert patterns.tau is None and patterns.hypothesis_holds is None
    assert column(separation_table(patterns, 2.0), "TV > τ") == ["—", "—", "—"]


def test_eta_squared_by_hand():
    # K = 0.6 ± 0.2 (method) ± 0.1 (substrate), balanced: SS_method = 4 · 0.04, SS_substrate
    # = 4 · 0.01, SS_total = 0.2. The TC row (NaN) is left out; constant factors are omitted.
    frame = pd.DataFrame(
        [
            {"method": m, "substrate": s, "base_model": "tiny", "seed": 0, "recipe": "none",
             "scoring_rule": "field-aware", "k_score": k}
            for m, s, k in [("a", "C", 0.9), ("a", "R", 0.7), ("b", "C", 0.5), ("b", "R", 0.3),
                            ("tc", "C", math.nan)]
        ]
    )
    result = sensitivity(frame)
    effects = {e.factor: e for e in result.effects}
    assert result.observations == 4
    assert effects["method"].eta_squared == pytest.approx(0.8)
    assert effects["substrate"].eta_squared == pytest.approx(0.2)
    assert [f for f in DESIGN_FACTORS if effects[f].eta_squared is None] == [
        "base_model", "seed", "recipe", "scoring_rule"
    ]


def test_sensitivity_of_the_design(comparison):
    s = comparison.sensitivity
    # (row, seed) pairs with a K-Score: C none/eraser/halver/migrator, R-struct none/eraser/hider,
    # each under both scoring rules.
    assert s.observations == 7 * 2 * 2
    omitted = {e.factor for e in s.effects if e.eta_squared is None}
    assert omitted == {"base_model", "recipe"}
    # Every seed gives the same K-Score here, so the seed explains nothing.
    assert {e.factor: e.eta_squared for e in s.effects}["seed"] == pytest.approx(0.0, abs=1e-12)


def test_lora_d_control_beside_the_adapter_free_baseline(comparison):
    (control,) = comparison.controls
    assert control.key == RowKey("tiny", "C", "lora-d", "none")
    assert control.forget.degeneration == pytest.approx(0.2)
    assert control.delta_degeneration == pytest.approx(0.2)
    assert control.baseline_run_ids == ("tiny-C-none-none-s0", "tiny-C-none-none-s137")
    assert all(r.key.recipe != "lora-d" for r in comparison.rows)  # no method verdict


def test_missing_baselines_are_reported_and_rows_appear_once_they_exist(comparison):
    (missing,) = comparison.missing
    assert (str(missing.key), str(missing.expected)) == ("tiny/P/lora/ga", "tiny/P/lora/none")
    with_baseline = compare(
        [*design(), cell_run("none", "P", recipe="lora", forget={"answer": 20}, retain=BASELINE_RETAIN)]
    )
    assert not with_baseline.missing
    assert row(with_baseline, "P", "ga", recipe="lora").verdict.verdict == "K-REF-inf"


def test_recipe_factor_varies_only_with_a_variant_recipe():
    # P's LoRA is its default recipe, as adapter-free is C's: the factor would restate the
    # substrate. Only a merged-weight variant makes it vary.
    p_lora = cell_run("none", "P", recipe="lora", forget={"answer": 20}, retain=BASELINE_RETAIN)
    p_merged = cell_run("none", "P", recipe="merged", forget={"answer": 10, "clean": 10}, retain=BASELINE_RETAIN)
    levels = {e.factor: e.levels for e in compare([*design(), p_lora]).sensitivity.effects}
    assert (levels["substrate"], levels["recipe"]) == (3, 1)
    effects = {e.factor: e for e in compare([*design(), p_lora, p_merged]).sensitivity.effects}
    assert effects["recipe"].levels == 2 and effects["recipe"].eta_squared > 0


def test_any_subset_of_cells_works():
    without_c_baseline = [c for c in design() if (c.substrate, c.method, c.recipe) != ("C", "none", "none")]
    result = compare(without_c_baseline)
    assert {m.key.method for m in result.missing if m.key.substrate == "C"} == {
        "none", "migrator", "collapser", "eraser", "halver"  # `none` here: the LoRA-D control
    }
    assert result.controls[0].baseline_forget is None
    assert {r.key.substrate for r in result.rows} == {"R-struct", "R-text"}
    empty = compare([])
    assert not empty.rows and not empty.leak_patterns and empty.sensitivity.observations == 0
    assert selectivity_frame(empty).empty


def test_latest_run_per_cell_key_wins():
    runs = [
        CellRunInfo("old", "tiny/C/none/none/0", 100, {}),
        CellRunInfo("new", "tiny/C/none/none/0", 200, {}),
        CellRunInfo("other", "tiny/C/none/none/137", 50, {}),
    ]
    assert [r.run_id for r in latest_per_key(runs)] == ["new", "other"]
    assert [r.run_id for r in latest_per_key(reversed(runs))] == ["new", "other"]


def test_two_runs_of_one_seed_in_a_row_are_refused():
    twice = [cell_run("none", "C", forget={"answer": 20}, retain=BASELINE_RETAIN)] * 2
    with pytest.raises(ValueError, match="two runs of one seed"):
        compare(twice)
