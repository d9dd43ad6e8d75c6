"""The comparison as tables of display strings (pure): what index.html and leaderboard.md show.

Every table is built once here; the HTML and Markdown writers only lay them out. Numbers
are formatted by `kbench.observer.format`, so a rate, a p-value or an interval reads the
same here as in `kbench score`, and every row that carries a number names its MLflow runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kbench.names import BASELINE_METHOD, PARAMETRIC, PROBED_AGENT_BASE, probed_p_key
from kbench.observer.channels import ATTACKER_BUDGETS, CHANNELS
from kbench.comparison.analysis import (
    Comparison,
    ControlResult,
    LeakPatterns,
    RowResult,
    SubstratePattern,
)
from kbench.comparison.collect import OutOfDesign
from kbench.observer.format import (
    MISSING,
    fmt_flag,
    fmt_p,
    fmt_rate,
    fmt_runs,
    fmt_signed,
    fmt_with_ci,
)
from kbench.observer.metrics import CellMetrics
from kbench.observer.statistics import tau_threshold
from kbench.observer.verdicts import K_CLASSES, TC, UNSCORED_VERDICTS

@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""

    def select(self, columns: Sequence[str]) -> "Table":
        """The same table with only `columns`, in that order."""
        index = [self.columns.index(c) for c in columns]
        return Table(self.title, tuple(columns), tuple(tuple(r[i] for i in index) for r in self.rows), self.note)


def shown_verdict(result: RowResult) -> str:
    """The verdict as the tables show it: a valid baseline row is the reference, not a class; a
    TC names its dominant failure mode, `TC (collapse)`."""
    verdict = result.verdict.verdict
    if result.key.is_baseline and verdict not in UNSCORED_VERDICTS:
        return "baseline"
    return f"{verdict} ({result.verdict.failure_mode})" if result.verdict.failure_mode else verdict


def shown_failures(metrics: CellMetrics) -> str:
    """The failure modes present, most frequent first: `refusal 12, collapse 3` (blank: none)."""
    present = sorted(((n, m) for m, n in metrics.failure_modes.items() if n), key=lambda x: (-x[0], x[1]))
    return ", ".join(f"{m} {n}" for n, m in present)


def shown_noop(result: RowResult) -> str:
    """`no-op on forget, retain` for a method whose traces are the baseline's on those splits, else blank."""
    return f"no-op on {', '.join(result.noop_splits)}" if result.noop_splits else ""


def shown_budget(result: RowResult) -> str:
    """A weight method's training budget: "matched" (the `unlearning` section) or the declared
    exceptions; empty for a method that trains nothing."""
    if not result.unlearned:
        return ""
    if not result.budget_exceptions:
        return "matched"
    return "differs: " + "; ".join(f"{key} ({reason})" for key, reason in result.budget_exceptions)


def shown_k_score(result: RowResult) -> str:
    """K-Score, or TC for a collapsed agent (never 0: a collapse is not a perfect forget)."""
    k = result.verdict.k_score
    if k is not None:
        return fmt_rate(k)
    return TC if result.verdict.verdict == TC else MISSING


def leaderboard_order(results: Iterable[RowResult]) -> list[RowResult]:
    """Highest K-Score first; rows without a K-Score (TC, invalid baseline) last."""
    return sorted(
        results,
        key=lambda r: (r.verdict.k_score is None, -(r.verdict.k_score or 0.0), r.key.method, r.key.recipe),
    )


def _grouped(results: Iterable[RowResult], key: Callable[[RowResult], tuple]) -> list[tuple[tuple, list[RowResult]]]:
    ordered = sorted(results, key=lambda r: (key(r), r.key))
    return [(k, list(g)) for k, g in itertools.groupby(ordered, key=key)]


def _cer_cells(metrics: CellMetrics) -> list[str]:
    return [fmt_with_ci(metrics.cer[c], metrics.ci.cer[c]) for c in CHANNELS]


LEADERBOARD_COLUMNS = (
    "Method", "Recipe", "Verdict", "No-op", "Budget", "K-Score", "OR forget [95% CI]", "OR retain [95% CI]",
    "Δsel", "D1", "Degen forget", "Degen retain", "Δdegen", "Failure modes forget", "Failure modes retain",
    "p", "p_adj", "p_adj retain", "Pairs",
    "Smallest p_adj", "Reachable classes", *(f"CER {c}" for c in CHANNELS), "Dominant", "Seeds", "Runs",
    "Baseline runs",
)
#: The leaderboard columns leaderboard.md keeps (the HTML has them all).
MARKDOWN_COLUMNS = (
    "Method", "Recipe", "Verdict", "No-op", "Budget", "K-Score", "OR forget [95% CI]", "OR retain [95% CI]",
    "Δsel", "D1", "Degen forget", "Δdegen", "Failure modes forget", "p_adj", "Pairs", "Smallest p_adj", "Dominant",
    "Seeds",
)


def _leaderboard_row(result: RowResult) -> tuple[str, ...]:
    v = result.verdict
    return (
        result.key.method,
        result.key.recipe,
        shown_verdict(result),
        shown_noop(result),
        shown_budget(result),
        shown_k_score(result),
        fmt_with_ci(result.forget.or_all, result.forget.ci.or_all),
        fmt_with_ci(result.retain.or_all, result.retain.ci.or_all),
        fmt_signed(v.delta_sel),
        fmt_flag(v.d1),
        fmt_rate(result.forget.degeneration),
        fmt_rate(result.retain.degeneration),
        fmt_rate(v.delta_degen),
        shown_failures(result.forget),
        shown_failures(result.retain),
        fmt_p(v.p),
        fmt_p(v.p_adj),
        fmt_p(result.p_adj_retain),
        str(result.test_forget.pairs),
        MISSING if result.smallest_p_adj is None else fmt_p(result.smallest_p_adj),
        ", ".join(result.reachable) or MISSING,
        *_cer_cells(result.forget),
        v.dominant_method or MISSING,
        ", ".join(map(str, result.seeds)),
        fmt_runs(result.run_ids),
        fmt_runs(result.baseline_run_ids),
    )


#: The ladder's columns in the order a reader climbs it (a form not listed goes last, by name).
FORM_ORDER = ("canonical", "paraphrase", "indirect", "completion", "adaptive")


def _rate(found: tuple[float, int] | None) -> str:
    return MISSING if found is None else f"{fmt_rate(found[0])} ({found[1]})"


def form_tables(comparison: Comparison) -> list[Table]:
    """The query-form ladder: per (base model, substrate), each row's forget OR(all) per form
    beside its baseline's; none without `queries.forms`."""
    tables = []
    for (base_model, substrate), group in _grouped(comparison.forms, lambda f: (f.key.base_model, f.key.substrate_label)):
        present = {form for f in group for form in f.method}
        forms = sorted(present, key=lambda f: (FORM_ORDER.index(f) if f in FORM_ORDER else len(FORM_ORDER), f))
        rows = tuple(
            (f.key.method_label, *(f"{_rate(f.method.get(form))} vs {_rate(f.baseline.get(form))}" for form in forms))
            for f in sorted(group, key=lambda f: f.key)
        )
        tables.append(Table(
            title=f"{base_model} · {substrate}: OR forget per query form",
            columns=("Method", *forms),
            rows=rows,
            note="Each cell: the row's forget OR(all) on the queries asked in that form (their number in "
            "brackets), vs its baseline's. canonical: the same queries asked canonically; adaptive: "
            "asked again only where the canonical answer was a refusal, so its queries differ by row. "
            "Every verdict reads the canonical questions alone (docs/comparison.md, Query forms).",
        ))
    return tables


def leaderboards(comparison: Comparison, substrates: Callable[[str], bool] = lambda _: True) -> list[Table]:
    """One leaderboard per (base model, substrate), sorted by K-Score; never pooled across
    substrates. `substrates`: which substrates get one (default: all)."""
    tables = []
    rows = [r for r in comparison.rows if substrates(r.key.substrate)]
    for (base_model, substrate), group in _grouped(rows, lambda r: (r.key.base_model, r.key.substrate)):
        tables.append(
            Table(
                title=f"{base_model} · {substrate}",
                columns=LEADERBOARD_COLUMNS,
                rows=tuple(_leaderboard_row(r) for r in leaderboard_order(group)),
                note="OR, CER and degeneration pool the seeds listed; CER is on the forget split. "
                "p: paired McNemar against the baseline on forget; p_adj: Benjamini–Hochberg within "
                "the forget (p_adj retain: retain) family of every method row in this report. "
                "Smallest p_adj: the least the row could reach with its pairs (every pair discordant, "
                "all one way, and every other test of the family at its own least); reachable "
                "classes: the K-classes that bound allows. No-op: the splits on which the method's "
                "trace records are the baseline's, byte for byte (same seeds and query ids, the "
                "method field aside): it changed nothing there, and a no-op on forget forgot nothing. "
                "Budget: a weight method trained under the matched budget (params `unlearning`) or "
                "the exceptions it declares; its unlearn run is named in the cell run's tag "
                "kbench.unlearn_key. Failure modes: trajectories per mode (tool_fallback, tool_loop, "
                "collapse, refusal, name_binding, format_break; docs/definitions.md); a TC verdict names "
                "the dominant mode of its degenerate trajectories.",
            )
        )
    return tables


def reach_line(comparison: Comparison) -> str:
    """The report's opening line: which K-classes the run can reach at all with its pairs."""
    tested = comparison.tested
    if not tested:
        return "Reachable verdict classes: none yet, since no method row has a baseline to be tested against."
    reachable = comparison.reachable_classes
    out = [c for c in K_CLASSES if c not in reachable]
    most = max(tested, key=lambda r: (r.test_forget.pairs, -(r.smallest_p_adj or 1.0)))
    line = f"Reachable verdict classes in this run: {', '.join(reachable)}."
    if out:
        line += (
            f" Out of reach at this sample size: {', '.join(out)} (the largest forget test has "
            f"{most.test_forget.pairs} pairs, so no p_adj can fall below {fmt_p(most.smallest_p_adj or 1.0)})."
        )
    return line


def verdict_matrix(comparison: Comparison) -> Table:
    """Method × (base model, substrate) → verdict: the shape of the paper's Table 7."""
    columns = sorted({(r.key.base_model, r.key.substrate_label) for r in comparison.rows})
    methods = sorted({r.key.method for r in comparison.rows}, key=lambda m: (m != BASELINE_METHOD, m))
    cells = {(r.key.method, r.key.base_model, r.key.substrate_label): shown_verdict(r) for r in comparison.rows}
    return Table(
        title="Verdict matrix",
        columns=("Method", *(f"{bm} · {label}" for bm, label in columns)),
        rows=tuple((m, *(cells.get((m, *c), "") for c in columns)) for m in methods),
        note="Blank: the cell was not run (or has no baseline, see Missing baselines).",
    )


def model_verdict_table(comparison: Comparison) -> Table:
    """(method, substrate) → verdict per base model, disagreements marked (an empty table with one model)."""
    across = comparison.models
    if across is None:
        return Table("Verdicts across base models", ("Substrate", "Method", "Agree"), ())
    rows = tuple((row.substrate, row.method, *(verdict or "" for _, verdict in row.verdicts),
                  "yes" if row.agree else "**no**") for row in across.verdicts)
    return Table(
        title="Verdicts across base models",
        columns=("Substrate", "Method", *across.models, "Agree"),
        rows=rows,
        note=f"{across.disagreements} of {len(across.verdicts)} rows disagree (a blank verdict: that model has "
        "no such row, which counts as a disagreement). Each model's verdict is read against its own baseline.",
    )


def model_tv_table(comparison: Comparison) -> Table:
    """Each pair of base models' baseline leak patterns per substrate: the TV between their share vectors."""
    across = comparison.models
    pairs = () if across is None else across.baseline_tv
    return Table(
        title="Baseline leak patterns across base models",
        columns=("Substrate", "Models", "TV"),
        rows=tuple((p.substrate, f"{p.first} · {p.second}", fmt_rate(p.tv)) for p in pairs),
        note="TV between the two models' seed-pooled baseline share vectors (forget split); "
        f"{MISSING}: one baseline never leaked or fails a validity gate. Each model's own leak "
        "pattern, τ and substrate pairs are in the leak-pattern tables.",
    )


def _flip_count(results: Sequence[RowResult]) -> str:
    tested = [r for r in results if r.by_budget]
    return f"{sum(r.flips for r in tested)} / {len(tested)}" if tested else MISSING


def attacker_budget_table(comparison: Comparison) -> Table:
    """Baseline forget OR under A1..A5 per substrate and how many verdicts flip from A1 to A5."""
    rows = []
    for (base_model, label), group in _grouped(comparison.rows, lambda r: (r.key.base_model, r.key.substrate_label)):
        for baseline in (r for r in group if r.key.is_baseline):
            rows.append((
                base_model,
                label,
                *(fmt_rate(baseline.forget.attacker_budget[b]) for b in ATTACKER_BUDGETS),
                _flip_count(group),
                fmt_runs(baseline.run_ids),
            ))
    budgets = " ⊂ ".join(f"{b} {{{', '.join(ch)}}}" for b, ch in ATTACKER_BUDGETS.items() if b != "A5")
    return Table(
        title="Attacker budgets: baseline OR (forget)",
        columns=("Base model", "Substrate", *ATTACKER_BUDGETS, "Verdict flips A1→A5", "Baseline runs"),
        rows=tuple(rows),
        note=f"{budgets} ⊂ A5 (all six channels). Flips: method rows of the substrate whose verdict "
        "under A1 differs from the verdict under A5.",
    )


def budget_verdict_table(comparison: Comparison) -> Table:
    """Each method row's verdict under every attacker budget."""
    rows = [
        (
            r.key.base_model, r.key.substrate_label, r.key.method,
            *(r.by_budget[b].verdict for b in ATTACKER_BUDGETS),
            fmt_flag(r.flips, "flips", ""),
        )
        for r in sorted(comparison.rows, key=lambda r: r.key)
        if r.by_budget
    ]
    return Table(
        title="Verdicts by attacker budget",
        columns=("Base model", "Substrate", "Method", *ATTACKER_BUDGETS, "A1→A5"),
        rows=tuple(rows),
        note="Each budget's McNemar tests form their own Benjamini–Hochberg family.",
    )


def _seed_tv(pattern: SubstratePattern) -> str:
    """Mean TV between the baseline's per-seed share vectors (τ's ingredient for this substrate)."""
    if len(pattern.seed_shares) < 2:
        return "one seed leaked: undefined" if pattern.seed_shares else "no seed leaked: undefined"
    return fmt_rate(tau_threshold({pattern.key.substrate_label: pattern.seed_shares}, 1.0))


def _pattern_row(s: SubstratePattern) -> tuple[str, ...]:
    if s.is_recipe:
        line, check = f"recipe {s.key.recipe} of {s.key.substrate}", fmt_rate(s.tv_to_default)
        status = ("invalid" if s.invalid else "valid") + " recipe: not a TV substrate"
    else:
        line, check = "substrate", ""
        status = "invalid: excluded from TV and τ" if s.invalid else "valid"
    return (
        s.key.substrate_label,
        line,
        *_cer_cells(s.metrics),
        fmt_rate(s.metrics.or_all),
        ", ".join(f"{c} {fmt_rate(v)}" for c, v in (s.metrics.shares or {}).items() if v) or MISSING,
        _seed_tv(s),
        check,
        status,
        fmt_runs(s.run_ids),
    )


def leak_pattern_table(patterns: LeakPatterns) -> Table:
    """The substrates' baselines, then each variant recipe's baseline as a recipe line."""
    rows = tuple(_pattern_row(s) for s in (*patterns.substrates, *patterns.recipes))
    return Table(
        title=f"Baseline leak pattern · {patterns.base_model}",
        columns=(
            "Substrate", "Line", *(f"CER {c}" for c in CHANNELS), "OR(all)", "Shares", "Between-seed TV",
            "TV to default recipe", "Baseline", "Runs",
        ),
        rows=rows,
        note="The `none` method on the forget split, seeds pooled. The substrates are P (its default "
        "recipe, the LoRA adapter), C, R-text and R-struct; a variant recipe (P merged) is a line of "
        "its own, not a substrate: its TV to the default recipe is a consistency check (near 0 when "
        "the recipes store the secret alike). Between-seed TV: mean TV between the share vectors of "
        "different seeds (needs two seeds that leaked).",
    )


def _tau_words(patterns: LeakPatterns) -> str:
    """Why τ is undefined, in words."""
    if patterns.seeds < 2:
        return "undefined: τ needs two seeds and this run has one"
    return "undefined: no valid substrate baseline leaked in two seeds"


def separation_table(patterns: LeakPatterns, tau_factor: float) -> Table:
    tau = patterns.tau
    rows = tuple(
        (
            pair.first,
            pair.second,
            fmt_rate(pair.tv),
            _tau_words(patterns) if tau is None else fmt_rate(tau),
            "not judged (no τ)" if tau is None else fmt_flag(pair.separated),
            "exempt" if pair.exempt else "",
        )
        for pair in patterns.pairs
    )
    notes = [
        f"τ = {tau_factor:g} × the largest between-seed TV of a valid substrate baseline"
        + ("" if tau is not None else f"; {_tau_words(patterns)}")
        + '. Hypothesis (docs/definitions.md, "Statistics"): every non-exempt pair has TV > τ; '
        + {True: "it holds.", False: "it does not hold.", None: "not judged."}[patterns.hypothesis_holds]
    ]
    if patterns.excluded:
        notes.append(f"Excluded, the baseline fails a validity gate: {', '.join(patterns.excluded)}.")
    if patterns.no_leak:
        notes.append(f"No leak at all, so no share vector: {', '.join(patterns.no_leak)}.")
    if patterns.recipes:
        notes.append(
            "Variant recipes are no substrates here: "
            + ", ".join(s.key.substrate_label for s in patterns.recipes) + " (see the leak-pattern table)."
        )
    return Table(
        title=f"Substrate separation · {patterns.base_model}",
        columns=("Substrate A", "Substrate B", "TV", "τ", "TV > τ", "Exempt"),
        rows=rows,
        note=" ".join(notes),
    )


def sensitivity_table(comparison: Comparison) -> Table:
    s = comparison.sensitivity
    rows = tuple(
        (
            e.factor,
            str(e.levels),
            fmt_rate(e.eta_squared),
            "" if e.eta_squared is not None else "constant: omitted",
        )
        for e in s.effects
    )
    rules = ", ".join(s.scoring_rules) or MISSING
    return Table(
        title="η² sensitivity of K-Score",
        columns=("Factor", "Levels", "η²", ""),
        rows=rows,
        note=f"{s.observations} K-Scores, one per (scoring rule, row, seed), TC and invalid-baseline "
        f"rows left out; every row is scored under each registered scoring rule ({rules}), the "
        f"leaderboards under scoring.rule = {comparison.config.rule} only. η² = type-II SS of the "
        "factor in a main-effects least-squares fit / total SS.",
    )


def _control_row(c: ControlResult) -> tuple[str, ...]:
    return (
        c.key.base_model,
        c.key.substrate,
        c.key.method,
        fmt_rate(c.forget.or_all),
        fmt_rate(c.retain.or_all),
        fmt_rate(c.forget.degeneration),
        fmt_rate(c.baseline_forget.or_all if c.baseline_forget else None),
        fmt_rate(c.baseline_retain.or_all if c.baseline_retain else None),
        fmt_rate(c.baseline_forget.degeneration if c.baseline_forget else None),
        fmt_signed(c.delta_degeneration),
        fmt_runs(c.run_ids),
        fmt_runs(c.baseline_run_ids),
    )


def control_table(comparison: Comparison) -> Table:
    return Table(
        title="LoRA-D degeneration control",
        columns=(
            "Base model", "Substrate", "Method", "LoRA-D OR forget", "LoRA-D OR retain", "LoRA-D degen",
            "Adapter-free OR forget", "Adapter-free OR retain", "Adapter-free degen", "Δdegen",
            "LoRA-D runs", "Adapter-free runs",
        ),
        rows=tuple(_control_row(c) for c in comparison.controls),
        note="A distractor-only adapter loaded with the substrate: what loading an adapter at all "
        "does to the agent. No verdict.",
    )


def missing_baseline_table(comparison: Comparison) -> Table:
    return Table(
        title="Missing baselines",
        columns=("Row", "Needs baseline", "Runs of the row"),
        rows=tuple((str(m.key), str(m.expected), fmt_runs(m.run_ids)) for m in comparison.missing),
        note="These rows have no verdict until a finished run of the baseline cell exists.",
    )


def not_in_design_table(runs: Sequence[OutOfDesign]) -> Table:
    """The store's cell keys whose runs belong to another design (left out of every number)."""
    return Table(
        title="Not in this design",
        columns=("Cell key", "Why", "Latest such run"),
        rows=tuple((r.key, r.reason, r.run_id) for r in runs),
        note="Cell runs in the same MLflow experiment made under other params (another base model, "
        "cell list, n, corpus, model or agent settings), or before cells carried design tags. They "
        "take part in no table, test or Benjamini–Hochberg family of this report; `kbench compare "
        "--params FILE` builds the report of their design.",
    )


# -- the direct-elicitation probes beside the observer (docs/probes.md) ---------------
def probed_key(result: RowResult) -> str:
    """The probe summary's key of the model a row deploys: the agent base off P."""
    k = result.key
    return probed_p_key(k.recipe, k.method) if k.substrate == PARAMETRIC else PROBED_AGENT_BASE


#: (column, score key, probe whose clean verdict marks it or None) of the probe blocks.
_PROBE_COLUMNS = (
    ("Recall (TOFU)", "probability.forget", None),
    ("Truth ratio", "truth_ratio.forget", None),
    ("Forget quality", "forget_quality", "tofu"),
    ("KnowMem", "knowmem.forget", "muse_knowmem"),
    ("VerbMem", "verbmem.forget", "muse_verbmem"),
    ("MIA AUC", "auc", "muse_mia"),
    ("MCQ", "mcq.forget", "wmdp_mcq"),
    ("Exact match", "exact_match.forget", "lume"),
)


def _probe_cell(entry: dict, key: str, probe: str | None) -> str:
    value = (entry.get("scores") or {}).get(key)
    shown = MISSING if value is None else (fmt_p(value) if key == "forget_quality" else fmt_rate(value))
    verdict = (entry.get("clean") or {}).get(probe) if probe else None
    return shown if verdict is None else f"{shown} ({'clean' if verdict else 'flags'})"


def _clean_probes(entry: dict) -> list[str]:
    """The probes calling the model clean, in the table's column order."""
    clean = entry.get("clean") or {}
    return [probe for _, _, probe in _PROBE_COLUMNS if probe and clean.get(probe)]


def probe_baseline_table(comparison: Comparison, probes: dict[str, dict]) -> Table:
    """Table 5's shape: per substrate's no-intervention row, each probe on the model it deploys
    beside the agent's OR(all), and every probe that calls the model clean while the observer
    finds the secret."""
    rows = []
    for result in sorted((r for r in comparison.rows if r.key.is_baseline), key=lambda r: r.key):
        entry = probes.get(probed_key(result))
        if entry is None:
            continue
        low = result.forget.ci.or_all[0] if result.forget.ci.or_all else None
        leaks = low is not None and low > 0
        clean = _clean_probes(entry)
        rows.append((
            result.key.substrate_label, probed_key(result),
            *(_probe_cell(entry, key, probe) for _, key, probe in _PROBE_COLUMNS),
            f"{len(clean)} of {len(entry.get('clean') or {})}",
            fmt_with_ci(result.forget.or_all, result.forget.ci.or_all),
            ("FALSE ALL-CLEAR: " + ", ".join(clean)) if leaks and clean else "",
        ))
    return Table(
        title="Probes beside the observer: no intervention",
        columns=("Substrate", "Probed model", *(c for c, _, _ in _PROBE_COLUMNS), "Probes clean",
                 "OR(all) forget [95% CI]", "Flag"),
        rows=tuple(rows),
        note="Each probe reads the deployed model alone (no agent, no system-prompt bios, no tools) on the "
        "design's forget queries: on C, R-text and R-struct that is the agent base, which never saw a secret. "
        "(clean)/(flags): the probe's verdict by the thresholds of docs/probes.md. FALSE ALL-CLEAR: a probe "
        "calls the model clean while the observer's OR(all) interval excludes 0. Raw probe rows: MLflow runs "
        "of kind probe; scores: artifacts/probes.",
    )


def probe_method_table(comparison: Comparison, probes: dict[str, dict]) -> Table:
    """Table 10's shape: on P, every method's probe scores beside its K-Score and verdict."""
    rows = []
    for result in leaderboard_order(r for r in comparison.rows if r.key.substrate == PARAMETRIC):
        entry = probes.get(probed_key(result))
        if entry is None:
            continue
        if "not_applicable" in entry:
            blank = ("n/a",) * (len(_PROBE_COLUMNS) + 2)
            probe_cells: tuple[str, ...] = blank
        else:
            s = entry.get("scores") or {}
            probe_cells = (
                *(_probe_cell(entry, key, probe) for _, key, probe in _PROBE_COLUMNS),
                fmt_rate(s.get("utility")), MISSING if s.get("privleak") is None else f"{s['privleak']:+.1f}%",
            )
        rows.append((
            result.key.method, result.key.recipe, *probe_cells,
            fmt_rate(result.forget.or_graded), fmt_rate(result.forget.degeneration), shown_k_score(result),
            shown_verdict(result), entry.get("not_applicable", ""),
        ))
    return Table(
        title="P: probes beside every method",
        columns=("Method", "Recipe", *(c for c, _, _ in _PROBE_COLUMNS), "Utility", "PrivLeak",
                 "Graded OR forget", "Degen forget", "K-Score", "Verdict", "Note"),
        rows=tuple(rows),
        note="Probe scores of each method's deployed model (its unlearned weights, or its hooks on the target) on "
        "the forget queries; utility: the harmonic mean of retain probability, retain truth-ratio score and "
        "general-ability share (TOFU's model utility); PrivLeak: the Min-K% AUC's distance from gold's. The "
        "K-Bench block is the observer on the deployed agent. n/a: the method acts on the agent's output only.",
    )
