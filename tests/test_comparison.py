"""The comparison's numbers and tables on a small design with answers computed by hand
(tests/_comparison_cells.py describes it): verdicts, BH families, leaderboards, verdict
matrix, attacker-budget flips, leak-pattern TV and τ, η², LoRA-D controls, missing baselines."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from _comparison_cells import BASELINE_RETAIN, SEEDS, cell_run, design

from kbench.comparison.analysis import DESIGN_FACTORS, RowKey, compare, sensitivity
from kbench.comparison.collect import CellRunInfo, latest_per_key
from kbench.comparison.plots import k_score_frame, selectivity_frame
from kbench.comparison.report import Provenance, ResultsHeader, comparison_record, render_markdown, render_results
from kbench.comparison.tables import (
    attacker_budget_table,
    budget_verdict_table,
    leaderboards,
    leak_pattern_table,
    model_verdict_table,
    reach_line,
    separation_table,
    verdict_matrix,
)

REPO = Path(__file__).resolve().parents[1]


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
    assert column(c, "Verdict") == ["K-REF-inf", "K-REF", "baseline", "K-SUP", "TC (format_break)"]
    assert column(c, "Failure modes forget")[4] == "format_break 40"  # 20 parse errors a seed, two seeds
    # the other rows' queries that do not leak answer "I do not know.": refusals, not breaks
    assert all("format_break" not in cell for cell in column(c, "Failure modes forget")[:4])
    assert column(c, "Failure modes forget")[0] == "refusal 40"  # eraser: no query leaks
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
    # largest, so τ = 2 · 0.2. Pooled C shares: answer 8/9, summary 1/9; R-struct ½, ½.
    # R-text's baseline is invalid (OR 0.05): listed and marked, but out of TV and τ.
    assert patterns.tau == pytest.approx(0.4)
    (pair,) = patterns.pairs
    assert (pair.first, pair.second) == ("C", "R-struct")
    assert pair.tv == pytest.approx(7 / 18) and not pair.separated and not pair.exempt
    assert patterns.hypothesis_holds is False
    assert patterns.excluded == ("R-text",)
    assert [s.invalid for s in patterns.substrates] == [False, False, True]
    table = separation_table(patterns, 2.0)
    assert column(table, "TV > τ") == ["no"] and column(table, "Exempt") == [""]
    assert "Excluded, the baseline fails a validity gate: R-text." in table.note
    baseline = dict(zip(column(leak_pattern_table(patterns), "Substrate"), column(leak_pattern_table(patterns), "Baseline")))
    assert baseline == {"C": "valid", "R-struct": "valid", "R-text": "invalid: excluded from TV and τ"}


def _p_baselines() -> list:
    """P baselines of both recipes over both seeds: LoRA leaks through the answer in each seed;
    merged through the answer in seed 0 and the summary in seed 137 (between-seed TV 1)."""
    cells = []
    for seed in (0, 137):
        cells.append(cell_run("none", "P", recipe="lora", seed=seed, forget={"answer": 20}, retain=BASELINE_RETAIN))
        merged = {"answer": 20} if seed == 0 else {"summary": 20}
        cells.append(cell_run("none", "P", recipe="merged", seed=seed, forget=merged, retain=BASELINE_RETAIN))
        for recipe in ("lora", "merged"):
            cells.append(cell_run("gold", "P", recipe=recipe, seed=seed, forget={"clean": 20}, retain=BASELINE_RETAIN))
    return cells


def test_the_merged_recipe_is_never_a_tv_substrate():
    result = compare([*design(), *_p_baselines()])
    (patterns,) = result.leak_patterns
    assert [s.key.substrate for s in patterns.substrates] == ["C", "P", "R-struct", "R-text"]
    assert {s.key.recipe for s in patterns.substrates if s.key.substrate == "P"} == {"lora"}
    named = {name for pair in patterns.pairs for name in (pair.first, pair.second)}
    assert named == {"C", "P", "R-struct"} and not any("merged" in name for name in named)
    # τ stays C's 2 · 0.2: merged's seeds (TV 1 apart) would have made it 2.
    assert patterns.tau == pytest.approx(0.4)
    (merged,) = patterns.recipes
    assert merged.key.recipe == "merged" and merged.is_recipe
    # Pooled merged shares ½ answer, ½ summary against LoRA's answer 1: TV ½.
    assert merged.tv_to_default == pytest.approx(0.5)
    table = leak_pattern_table(patterns)
    lines = dict(zip(column(table, "Substrate"), column(table, "Line")))
    assert lines == {"C": "substrate", "P": "substrate", "R-struct": "substrate", "R-text": "substrate",
                     "P (merged)": "recipe merged of P"}
    assert column(table, "TV to default recipe")[-1] == "0.500"
    assert "P (merged)" in separation_table(patterns, 2.0).note
    # The merged recipe keeps its own leaderboard rows.
    (p_board,) = [t for t in leaderboards(result) if t.title == "tiny · P"]
    assert sorted(zip(column(p_board, "Method"), column(p_board, "Recipe"))) == [
        ("ga", "lora"), ("gold", "lora"), ("gold", "merged"), ("none", "lora"), ("none", "merged")
    ]


def test_tau_is_undefined_with_one_seed_and_the_report_says_so_in_words():
    cells = [c for c in design() if c.seed == 0]
    (patterns,) = compare(cells).leak_patterns
    assert patterns.tau is None and patterns.hypothesis_holds is None and patterns.seeds == 1
    table = separation_table(patterns, 2.0)
    assert column(table, "τ") == ["undefined: τ needs two seeds and this run has one"]
    assert column(table, "TV > τ") == ["not judged (no τ)"]
    assert "this run has one" in table.note
    assert set(column(leak_pattern_table(patterns), "Between-seed TV")) == {"one seed leaked: undefined"}


def test_eta_squared_by_hand():
    # K = 0.6 ± 0.2 (method) ± 0.1 (substrate), balanced: SS_method = 4 · 0.04, SS_substrate
    # = 4 · 0.01, SS_total = 0.2. The TC row (NaN) is left out; constant factors are omitted.
    frame = pd.DataFrame(
        [
            {"method": m, "substrate": s, "base_model": "tiny", "seed": 0, "recipe": "none",
             "scoring_rule": "field-aware", "query_form": "canonical", "k_score": k}
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
        "base_model", "seed", "recipe", "scoring_rule", "query_form"
    ]


def test_sensitivity_of_the_design(comparison):
    s = comparison.sensitivity
    # (row, seed) pairs with a K-Score: C none/eraser/halver/migrator, R-struct none/eraser/hider,
    # each under both scoring rules.
    assert s.observations == 7 * 2 * 2
    omitted = {e.factor for e in s.effects if e.eta_squared is None}
    assert omitted == {"base_model", "recipe", "query_form"}
    # Every seed gives the same K-Score here, so the seed explains nothing.
    assert {e.factor: e.eta_squared for e in s.effects}["seed"] == pytest.approx(0.0, abs=1e-12)


def _small_run(n: int, seeds=(0,)) -> list:
    """A one-substrate run with n queries per split and seed: the baseline leaks on every
    forget query, `eraser` on none."""
    return [
        cell_run(method, "C", seed=seed, forget={"answer": n} if method == "none" else {"clean": n},
                 retain={"answer": n})
        for method in ("none", "eraser")
        for seed in seeds
    ]


def test_four_pairs_cannot_reach_a_k_ref_class_and_the_report_opens_saying_so():
    result = compare(_small_run(4))
    eraser = row(result, "C", "eraser")
    assert eraser.test_forget.pairs == 4 and eraser.verdict.p_adj == pytest.approx(0.125)
    assert eraser.smallest_p_adj == pytest.approx(0.125)
    assert eraser.reachable == ("K-SUP", "MF", "ambiguous")
    # A leak that vanished at low power has no channel it moved to: not K-SUP (docs/definitions.md §8).
    assert eraser.verdict.verdict == "ambiguous"
    line = reach_line(result)
    reachable, _, out = line.partition(" Out of reach")
    assert reachable == "Reachable verdict classes in this run: K-SUP, MF, ambiguous."
    assert "K-REF" not in reachable and "K-REF-inf, K-REF" in out and "4 pairs" in out and "0.125" in out
    assert row(result, "C", "none").smallest_p_adj is None and row(result, "C", "none").reachable == ()
    board = leaderboards(result)[0]
    assert column(board, "Method") == ["eraser", "none"]
    assert column(board, "Smallest p_adj") == ["0.125", "—"]
    assert column(board, "Reachable classes") == ["K-SUP, MF, ambiguous", "—"]
    markdown = render_markdown(result, Provenance("kbench", "sqlite:///mlflow.db", 2, "abc"))
    assert markdown.splitlines()[2] == f"**{line}**"


def test_enough_pairs_reach_every_class():
    # 11 pairs: smallest p 2 · ½¹¹ < 0.001; 6 pairs: 2 · ½⁶ < 0.05; two seeds pool their pairs.
    assert compare(_small_run(11)).reachable_classes == ("K-REF-inf", "K-REF", "K-SUP", "MF", "ambiguous")
    assert compare(_small_run(6)).reachable_classes == ("K-REF", "K-SUP", "MF", "ambiguous")
    two_seeds = compare(_small_run(6, seeds=(0, 137)))
    assert row(two_seeds, "C", "eraser").test_forget.pairs == 12
    assert "Out of reach" not in reach_line(two_seeds)
    assert reach_line(compare([])).startswith("Reachable verdict classes: none yet")


def test_selectivity_scatter_is_forget_or_against_retain_or_with_none_and_gold_labelled():
    result = compare([*design(), *_p_baselines()])
    frame = selectivity_frame(result)
    assert list(frame.columns[:4]) == ["substrate", "method", "or_forget", "or_retain"]
    assert len(frame) == len(result.rows)  # one point per (substrate, method) row, baselines included
    point = frame.set_index(["substrate", "method"])
    assert point.loc[("C", "migrator"), ["or_forget", "or_retain"]].tolist() == pytest.approx([0.8, 0.45])
    assert point.loc[("C", "none"), ["or_forget", "or_retain"]].tolist() == pytest.approx([0.8, 0.5])
    labelled = frame[frame["label"] != ""]
    assert set(zip(labelled["substrate"], labelled["label"])) == {
        ("C", "none"), ("R-struct", "none"), ("R-text", "none"), ("P", "none"), ("P (merged)", "none"),
        ("P", "gold"), ("P (merged)", "gold"),
    }
    # The DVC plot reads the same two columns of the same CSV.
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["compare"]["plots"]
    (spec,) = [p["reports/plots/selectivity.csv"] for p in plots if isinstance(p, dict) and "reports/plots/selectivity.csv" in p]
    assert (spec["x"], spec["y"]) == ("or_forget", "or_retain")


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


# -- the probes beside the observer ------------------------------------------------------------
def _probe_entry(clean: bool, value: float) -> dict:
    keys = ("probability.forget", "truth_ratio.forget", "forget_quality", "knowmem.forget", "verbmem.forget",
            "auc", "mcq.forget", "exact_match.forget", "utility", "privleak")
    probes = ("tofu", "muse_knowmem", "muse_verbmem", "muse_mia", "wmdp_mcq", "lume")
    return {"scores": {k: value for k in keys}, "clean": {p: clean for p in probes}}


@pytest.fixture(scope="module")
def probed():
    cells = design()
    for seed in (0, 137):
        cells.append(cell_run("none", "P", recipe="lora", seed=seed, forget={"summary": 14, "clean": 6},
                              retain=BASELINE_RETAIN))
    cells.append(cell_run("star", "P", recipe="lora", forget={"summary": 14, "clean": 6}, retain=BASELINE_RETAIN))
    summary = {
        "agent-base": _probe_entry(True, 0.25),  # the model C and R deploy never saw a secret
        "P__lora__none": _probe_entry(False, 0.9),
        "P__lora__ga": _probe_entry(True, 0.1),
        "P__lora__star": {"substrate": "P", "recipe": "lora", "method": "star", "not_applicable": "star acts on the agent's output only"},
    }
    return compare(cells), summary


def test_the_probe_baseline_table_flags_a_false_all_clear(probed):
    from kbench.comparison.tables import probe_baseline_table

    comparison, summary = probed
    table = probe_baseline_table(comparison, summary)
    by_substrate = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    assert set(by_substrate) == {"C", "R-struct", "R-text", "P"}
    # C and R-struct leak through the agent while every probe calls the agent base clean
    for substrate in ("C", "R-struct"):
        assert by_substrate[substrate]["Probed model"] == "agent-base"
        assert by_substrate[substrate]["Flag"].startswith("FALSE ALL-CLEAR: tofu, muse_knowmem")
        assert by_substrate[substrate]["Probes clean"] == "6 of 6"
    # P: the probes flag the target, as the observer does: no false all-clear
    assert by_substrate["P"]["Probed model"] == "P__lora__none" and by_substrate["P"]["Flag"] == ""
    assert by_substrate["P"]["MCQ"] == "0.900 (flags)" and by_substrate["P"]["Forget quality"] == "0.900 (flags)"
    assert by_substrate["C"]["OR(all) forget [95% CI]"].startswith("0.800")


def test_the_probe_method_table_sets_probes_beside_each_k_score(probed):
    from kbench.comparison.tables import probe_method_table

    comparison, summary = probed
    table = probe_method_table(comparison, summary)
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    assert set(rows) == {"none", "ga", "star"}
    assert rows["ga"]["Exact match"] == "0.100 (clean)" and rows["ga"]["PrivLeak"] == "+0.1%"
    from kbench.comparison.tables import shown_k_score

    assert rows["ga"]["K-Score"] == shown_k_score(row(comparison, "P", "ga", "lora"))
    assert rows["star"]["MCQ"] == "n/a" and "output only" in rows["star"]["Note"]


def test_the_report_shows_the_probe_tables_only_when_the_stage_ran(probed):
    comparison, summary = probed
    provenance = Provenance(experiment="e", tracking_uri="sqlite://", cell_runs=1, git_commit="abc")
    with_probes = render_markdown(comparison, provenance, summary)
    assert "Probes beside the observer: no intervention" in with_probes and "P: probes beside every method" in with_probes
    assert "Probes beside the observer" not in render_markdown(comparison, provenance)
    assert comparison_record(comparison, provenance, summary).probes == summary


def _on_model(cells, base_model):
    """The same cells measured on another base model."""
    return [dataclasses.replace(c, base_model=base_model, run_id=c.run_id.replace(c.base_model, base_model, 1))
            for c in cells]


def test_two_base_models_give_verdicts_side_by_side_and_the_tv_between_their_patterns():
    """The base model as a factor: one model's cells alone give no cross-model tables; the same
    design measured on a second model, where `halver` leaks as much as the baseline, gives the
    verdict table with that row marked and the other rows agreeing, TV 0 between identical
    baseline patterns and a filled base-model η² factor."""
    assert compare(design()).models is None
    other = _on_model(design(), "other")
    other = [dataclasses.replace(c, records=tuple(r for r in cell_run(
        "halver", "C", forget={"answer": 16, "clean": 4}, retain=BASELINE_RETAIN, seed=c.seed,
        base_model="other").records)) if (c.method, c.substrate) == ("halver", "C") else c for c in other]
    comparison = compare(design() + other)
    across = comparison.models
    assert across.models == ("other", "tiny")
    rows = {(r.method, r.substrate): r for r in across.verdicts}
    one = {r.key.method_label: r.verdict.verdict for r in compare(design()).tested if r.key.substrate == "C"}
    assert dict(rows["halver", "C"].verdicts)["tiny"] == one["halver"]
    assert dict(rows["halver", "C"].verdicts)["other"] != one["halver"] and not rows["halver", "C"].agree
    assert all(row.agree for key, row in rows.items() if key != ("halver", "C"))
    assert across.disagreements == 1
    tvs = {p.substrate: p.tv for p in across.baseline_tv}
    assert tvs["C"] == 0.0 and tvs["R-text"] is None  # identical baselines; R-text's is invalid
    factor = {e.factor: e for e in comparison.sensitivity.effects}["base_model"]
    assert factor.levels == 2 and factor.eta_squared is not None

    table = model_verdict_table(comparison)
    assert table.columns == ("Substrate", "Method", "other", "tiny", "Agree")
    assert ("C", "halver", rows["halver", "C"].verdicts[0][1], one["halver"], "**no**") in table.rows
    page = render_results(comparison, ResultsHeader("d", 20, SEEDS, "tiny", "c"))
    assert "## Across base models" in page and "1 of" in page and "Baseline leak patterns across base models" in page
    assert "## Across base models" not in render_results(compare(design()), ResultsHeader("d", 20, SEEDS, "tiny", "c"))
    assert comparison_record(comparison).models.disagreements == 1
    assert "models" not in comparison_record(compare(design())).model_dump(mode="json")
