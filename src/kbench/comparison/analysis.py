"""The comparison's numbers, from finished cell runs (pure: no MLflow, no files).

Cell runs are grouped into rows (base model, substrate, injection recipe, method) that pool
their seeds. Each method row is paired with the `none` row of the same base model, substrate
and recipe (docs/tracking.md); LoRA-D rows are degeneration controls read beside the
adapter-free baseline of their substrate. Every metric, test and verdict comes from the
observer modules (metrics, statistics, verdicts); this module only decides what is compared
with what and which tests form a Benjamini–Hochberg family, and on which splits a method
changed nothing at all (its trace records are the baseline's, byte for byte: `noop_splits`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from kbench.config import ScoringConfig
from kbench.names import ADAPTER_FREE, BASELINE_METHOD, CONTROL, FIELD_AWARE_RULE, GOLD_METHOD, LORA
from kbench.observer.channels import ATTACKER_BUDGETS
from kbench.observer.matcher import scoring_rule_names
from kbench.observer.metrics import CellMetrics, ScoredQueries, cell_metrics, score_queries
from kbench.observer.diff import TraceDiff, diff_traces, find_record, telling_query
from kbench.observer.taxonomy import NameIndex
from kbench.observer.power import smallest_p_adjusted
from kbench.observer.statistics import (
    McNemarResult,
    SubstrateSeparation,
    benjamini_hochberg,
    eta_squared,
    paired_mcnemar,
    substrate_separation,
    tau_threshold,
    tv_distance,
)
from kbench.observer.verdicts import (
    INVALID_BASELINE,
    K_CLASSES,
    CellQuartet,
    VerdictResult,
    decide_verdict,
    reachable_classes,
    verdicts_by_budget,
)
from kbench.forms import CANONICAL, form_class
from kbench.records import FORGET, RETAIN, SPLITS, TraceRecord

#: The distractor-only control adapter loaded with a non-P substrate
#: (docs/definitions.md, "Substrates and the LoRA-D control").
CONTROL_RECIPE = CONTROL
#: The recipe a non-P substrate runs without any adapter; LoRA-D controls are read beside it.
ADAPTER_FREE_RECIPE = ADAPTER_FREE
#: Recipes a substrate is normally injected with (adapter-free for C / R-*, LoRA for P); a row
#: of any other recipe (P merged) is labelled with its recipe so it is never mistaken for them.
DEFAULT_RECIPES = frozenset({ADAPTER_FREE, LORA})
#: The budget an attacker reading only answers has, and the full multi-channel observer.
NARROWEST_BUDGET, WIDEST_BUDGET = next(iter(ATTACKER_BUDGETS)), list(ATTACKER_BUDGETS)[-1]
#: The design factors of the η² analysis (docs/definitions.md, "Statistics"), as columns of the per-seed
#: K-Score frame. The scoring rule varies because every (row, seed) is scored under each registered matcher rule.
DESIGN_FACTORS: tuple[str, ...] = ("method", "substrate", "base_model", "seed", "recipe", "scoring_rule", "query_form")


@dataclass(frozen=True)
class CellRun:
    """One finished cell run (one seed of a row) and its trace records."""

    run_id: str
    base_model: str
    substrate: str
    recipe: str
    method: str
    seed: int
    records: tuple[TraceRecord, ...]
    #: A weight method's cell: the unlearn run whose weights it deployed (its MLflow key), else None.
    unlearned: str | None = None
    #: A weight method's cell: the `unlearning` keys its run set differently, with the reason.
    budget_exceptions: tuple[tuple[str, str], ...] = ()

    @property
    def row_key(self) -> "RowKey":
        return RowKey(self.base_model, self.substrate, self.recipe, self.method)


@dataclass(frozen=True, order=True)
class RowKey:
    base_model: str
    substrate: str
    recipe: str
    method: str

    @property
    def is_control(self) -> bool:
        return self.recipe == CONTROL_RECIPE

    @property
    def is_baseline(self) -> bool:
        return self.method == BASELINE_METHOD and not self.is_control

    @property
    def baseline(self) -> "RowKey":
        """The `none` row this row is read against (docs/tracking.md, baseline pairing)."""
        recipe = ADAPTER_FREE_RECIPE if self.is_control else self.recipe
        return RowKey(self.base_model, self.substrate, recipe, BASELINE_METHOD)

    @property
    def substrate_label(self) -> str:
        """The substrate as a column heading: `P`, `C`, or `P (merged)` for a non-default recipe."""
        return self.substrate if self.recipe in DEFAULT_RECIPES else f"{self.substrate} ({self.recipe})"

    @property
    def method_label(self) -> str:
        """The method, with its recipe when that is not the substrate's default (`ga (merged)`)."""
        return self.method if self.recipe in DEFAULT_RECIPES else f"{self.method} ({self.recipe})"

    def __str__(self) -> str:
        return f"{self.base_model}/{self.substrate}/{self.recipe}/{self.method}"


@dataclass(frozen=True)
class Row:
    """A row's runs and its queries read by the matcher, pooled over seeds and per seed."""

    key: RowKey
    run_ids: tuple[str, ...]  # in seed order
    seeds: tuple[int, ...]
    pooled: dict[str, ScoredQueries]  # split -> queries of every seed
    by_seed: dict[int, dict[str, ScoredQueries]]  # seed -> split -> queries
    records: dict[int, tuple[TraceRecord, ...]]  # seed -> the cell run's trace records
    #: seed -> the query-form ladder's forget queries by form (`_forms`); empty without a ladder.
    forms: dict[int, dict[str, ScoredQueries]] = field(default_factory=dict)
    #: Weight methods: the unlearn runs deployed (one per recipe) and their budget exceptions.
    unlearned: tuple[str, ...] = ()
    budget_exceptions: tuple[tuple[str, str], ...] = ()


def _split(records: Sequence[TraceRecord], split: str, where: str, rule: str, names: NameIndex | None
           ) -> ScoredQueries:
    chosen = [r for r in records if r.split == split and r.form is None]  # the canonical questions
    if not chosen:
        raise ValueError(f"{where} has no {split} trace records; a cell run holds both splits")
    return score_queries(chosen, rule, names)


def group_rows(cells: Iterable[CellRun], rule: str = FIELD_AWARE_RULE, names: NameIndex | None = None
               ) -> dict[RowKey, Row]:
    """Rows of the comparison: the cell runs of each (base model, substrate, recipe, method),
    their queries read under one scoring rule (`names`: the corpus's people, for name bindings)."""
    grouped: dict[RowKey, list[CellRun]] = defaultdict(list)
    for cell in cells:
        grouped[cell.row_key].append(cell)
    rows = {}
    for key, runs in sorted(grouped.items()):
        runs.sort(key=lambda run: run.seed)
        seeds = [run.seed for run in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"row {key} has two runs of one seed ({seeds}); keep the latest run per cell key")
        records = [record for run in runs for record in run.records]
        rows[key] = Row(
            key=key,
            run_ids=tuple(run.run_id for run in runs),
            seeds=tuple(seeds),
            pooled={split: _split(records, split, f"row {key}", rule, names) for split in SPLITS},
            by_seed={
                run.seed: {split: _split(run.records, split, f"run {run.run_id} ({key})", rule, names)
                           for split in SPLITS}
                for run in runs
            },
            records={run.seed: run.records for run in runs},
            forms={run.seed: _forms(run.records, rule, names) for run in runs},
            unlearned=tuple(sorted({run.unlearned for run in runs if run.unlearned})),
            budget_exceptions=tuple(sorted({e for run in runs for e in run.budget_exceptions})),
        )
    return rows


def _forms(records: Sequence[TraceRecord], rule: str, names: NameIndex | None) -> dict[str, ScoredQueries]:
    """The ladder's forget queries by form (`queries.forms`); `CANONICAL`: the canonical questions
    the ladder asked again (none without a ladder)."""
    asked: dict[str, list[TraceRecord]] = defaultdict(list)
    for record in records:
        if record.split == FORGET and record.form is not None:
            asked[record.form].append(record)
    if not asked:
        return {}
    laddered = [form for form in asked if not form_class(form).adaptive] or list(asked)
    again = {r.query_id.rsplit("::", 1)[0] for form in laddered for r in asked[form]}
    canonical = [r for r in records if r.split == FORGET and r.form is None and r.query_id in again]
    return {form: score_queries(found, rule, names) for form, found in sorted({CANONICAL: canonical, **asked}.items())}


def trace_bytes(record: TraceRecord) -> str:
    """A trace record as traces.jsonl holds it (`model_dump_json`), its `method` set to the
    baseline's, so that a method's record and the baseline's compare byte for byte."""
    return record.model_copy(update={"method": BASELINE_METHOD}).model_dump_json()


def identical_traces(records: Sequence[TraceRecord], baseline: Sequence[TraceRecord]) -> bool:
    """The records are the baseline's: the same query ids, and each query's record serialized
    as the baseline's record of that query (`trace_bytes`, the `method` field aside)."""

    def by_query(chosen: Sequence[TraceRecord]) -> list[tuple[str, str]]:
        return sorted((record.query_id, trace_bytes(record)) for record in chosen)

    return by_query(records) == by_query(baseline)


def noop_splits(row: Row, baseline: Row) -> tuple[str, ...]:
    """The splits on which the method of `row` changed nothing, in SPLITS order.

    A split is a no-op when every cell run of the row (one per seed) has a baseline cell of
    the same seed, and the two cells' records of that split are identical (`identical_traces`).
    `baseline` must be the `none` row of the same base model, substrate and recipe; a baseline
    row, the `gold` row (another adapter) and a LoRA-D control are never no-ops.
    """
    key = row.key
    same_cell = RowKey(key.base_model, key.substrate, key.recipe, BASELINE_METHOD)
    if key.is_baseline or key.is_control or key.method == GOLD_METHOD or baseline.key != same_cell:
        return ()

    def identical_on(split: str) -> bool:
        return all(
            seed in baseline.records
            and identical_traces(
                [r for r in records if r.split == split], [r for r in baseline.records[seed] if r.split == split]
            )
            for seed, records in row.records.items()
        )

    return tuple(split for split in SPLITS if identical_on(split))


@dataclass(frozen=True)
class RowResult:
    """A method row (or a baseline row) against its baseline: metrics, tests, verdicts."""

    key: RowKey
    run_ids: tuple[str, ...]
    seeds: tuple[int, ...]
    baseline_run_ids: tuple[str, ...]
    forget: CellMetrics
    retain: CellMetrics
    test_forget: McNemarResult
    test_retain: McNemarResult
    p_adj_retain: float
    verdict: VerdictResult
    #: Verdict under each attacker budget A1..A5; empty for a baseline row (nothing to test).
    by_budget: dict[str, VerdictResult]
    #: The smallest p_adj the row's forget test could reach with its pairs, whatever the queries
    #: had shown (`kbench.observer.power.smallest_p_adjusted` over the forget family); None for
    #: a baseline row, which is no test.
    smallest_p_adj: float | None = None
    #: The K-classes that bound leaves reachable (`reachable_classes`); empty for a baseline row.
    reachable: tuple[str, ...] = ()
    #: The splits on which the method's trace records are the baseline's, byte for byte
    #: (`noop_splits`): it changed nothing there. Empty for the baseline and `gold` rows.
    noop_splits: tuple[str, ...] = ()
    #: A weight method's row: the unlearn runs its cells deployed (empty for any other method).
    unlearned: tuple[str, ...] = ()
    #: A weight method's row: the `unlearning` keys it trained with differently, and why.
    budget_exceptions: tuple[tuple[str, str], ...] = ()

    @property
    def flips(self) -> bool:
        """The verdict an answer-only attacker sees differs from the full observer's."""
        return bool(self.by_budget) and (
            self.by_budget[NARROWEST_BUDGET].verdict != self.by_budget[WIDEST_BUDGET].verdict
        )


@dataclass(frozen=True)
class ControlResult:
    """A LoRA-D row beside the adapter-free baseline of its substrate (None when that is missing)."""

    key: RowKey
    run_ids: tuple[str, ...]
    forget: CellMetrics
    retain: CellMetrics
    baseline_run_ids: tuple[str, ...]
    baseline_forget: CellMetrics | None
    baseline_retain: CellMetrics | None

    @property
    def delta_degeneration(self) -> float | None:
        """Degeneration added by loading an adapter at all (forget split)."""
        if self.baseline_forget is None:
            return None
        return self.forget.degeneration - self.baseline_forget.degeneration


@dataclass(frozen=True)
class MissingBaseline:
    """A row that could not be compared because its `none` row has no finished run."""

    key: RowKey
    expected: RowKey
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class SubstratePattern:
    """One baseline's leak pattern (forget split) and how stable it is across seeds."""

    key: RowKey
    metrics: CellMetrics
    run_ids: tuple[str, ...]
    seed_shares: tuple[dict[str, float | None], ...]  # share vector of each seed that leaked
    #: The baseline fails a validity gate (docs/definitions.md, "Gates, verdicts and K-Score", rule 1):
    #: shown, but out of TV and τ.
    invalid: bool
    #: A recipe line (P merged): TV between its pooled shares and those of its substrate's
    #: default recipe, a consistency check expected near 0; None on a substrate line, or when
    #: either side has no share vector.
    tv_to_default: float | None = None

    @property
    def is_recipe(self) -> bool:
        """A variant recipe of a substrate (P merged), not one of the four substrates."""
        return self.key.recipe not in DEFAULT_RECIPES


@dataclass(frozen=True)
class LeakPatterns:
    """The substrate leak-pattern hypothesis (docs/definitions.md, "Statistics") for one base model.

    The substrates are P, C, R-text and R-struct, each with its default recipe (LoRA for P);
    a variant recipe (P merged) is a `recipes` line beside them, never a substrate of the TV
    pairs or of τ. Invalid baselines are listed but take part in neither.
    """

    base_model: str
    substrates: tuple[SubstratePattern, ...]
    #: Baselines of variant recipes, each with its TV to the default recipe of its substrate.
    recipes: tuple[SubstratePattern, ...]
    tau: float | None  # None: no valid substrate has two seeds with a defined share vector
    pairs: tuple[SubstrateSeparation, ...]
    no_leak: tuple[str, ...]  # valid substrates whose baseline never leaked: no share vector, no TV
    #: The most seeds any valid substrate baseline has (τ needs two).
    seeds: int = 0

    @property
    def excluded(self) -> tuple[str, ...]:
        """Substrates whose baseline failed a validity gate: out of TV and τ."""
        return tuple(s.key.substrate_label for s in self.substrates if s.invalid)

    @property
    def hypothesis_holds(self) -> bool | None:
        """Every non-exempt pair separated by more than τ; None when τ or the pairs are missing."""
        judged = [pair for pair in self.pairs if not pair.exempt]
        if self.tau is None or not judged:
            return None
        return all(pair.separated for pair in judged)


@dataclass(frozen=True)
class FactorEffect:
    factor: str
    levels: int
    eta_squared: float | None  # None: the factor is constant in the runs, so it is omitted


@dataclass(frozen=True)
class Sensitivity:
    """η² of each design factor on the per-seed K-Scores (docs/definitions.md, "Statistics"; RQ4)."""

    observations: int
    effects: tuple[FactorEffect, ...]
    #: The scoring rules every (row, seed) was scored under (the `scoring_rule` factor's levels).
    scoring_rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelPairTV:
    """Two base models' baseline leak patterns on one substrate: the TV between their share vectors."""

    substrate: str  # the substrate's label (`P (merged)` for a variant recipe)
    first: str
    second: str
    #: None when either baseline has no share vector (it never leaked) or fails a validity gate.
    tv: float | None


@dataclass(frozen=True)
class VerdictAcrossModels:
    """One method on one substrate, its verdict under each base model (RQ4: the model as a factor)."""

    method: str  # the method's label (with its recipe off the substrate's default)
    substrate: str  # the substrate's label
    #: (base model, verdict) in the comparison's model order; None: no row of that model.
    verdicts: tuple[tuple[str, str | None], ...]

    @property
    def agree(self) -> bool:
        """Every model has the row and gives it the same verdict."""
        found = [verdict for _, verdict in self.verdicts]
        return None not in found and len(set(found)) == 1


@dataclass(frozen=True)
class AcrossModels:
    """The base model read as a factor of the comparison (present with two models or more)."""

    models: tuple[str, ...]
    baseline_tv: tuple[ModelPairTV, ...]
    verdicts: tuple[VerdictAcrossModels, ...]

    @property
    def disagreements(self) -> int:
        return sum(not row.agree for row in self.verdicts)


def across_models(results: Sequence[RowResult], patterns: Sequence[LeakPatterns]) -> AcrossModels | None:
    """Each pair of base models' baseline TV per substrate and each (method, substrate)'s verdict
    per model; None when the rows hold fewer than two base models."""
    models = tuple(sorted({r.key.base_model for r in results}))
    if len(models) < 2:
        return None
    shares = {(p.base_model, s.key.substrate_label): None if s.invalid else s.metrics.shares
              for p in patterns for s in (*p.substrates, *p.recipes)}
    substrates = sorted({label for _, label in shares})
    pairs = []
    for substrate in substrates:
        for first, second in itertools.combinations(models, 2):
            a, b = shares.get((first, substrate)), shares.get((second, substrate))
            pairs.append(ModelPairTV(substrate, first, second, None if a is None or b is None else tv_distance(a, b)))
    by_row: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for r in results:
        if not r.key.is_baseline:
            by_row[r.key.method_label, r.key.substrate_label][r.key.base_model] = r.verdict.verdict
    verdicts = tuple(VerdictAcrossModels(method, substrate, tuple((m, found.get(m)) for m in models))
                     for (method, substrate), found in sorted(by_row.items(), key=lambda item: (item[0][1], item[0][0])))
    return AcrossModels(models, tuple(pairs), verdicts)


@dataclass(frozen=True)
class FormRates:
    """A row's forget OR(all) per query form (the ladder), beside its baseline's, seeds pooled:
    form -> (OR(all), queries). `canonical` is read on the queries the ladder asked again; the
    adaptive form on the queries the row's agent refused, so its n differs between rows."""

    key: RowKey
    method: dict[str, tuple[float, int]]
    baseline: dict[str, tuple[float, int]]


def _form_rates(row: Row) -> dict[str, tuple[float, int]]:
    leaked: dict[str, int] = defaultdict(int)
    asked: dict[str, int] = defaultdict(int)
    for forms in row.forms.values():
        for form, scored in forms.items():
            leaked[form] += int(scored.leaked().sum())
            asked[form] += scored.n
    return {form: (leaked[form] / asked[form] if asked[form] else math.nan, asked[form]) for form in sorted(asked)}


def form_rates(rows: Mapping[RowKey, Row], results: Sequence[RowResult]) -> tuple[FormRates, ...]:
    """The ladder's table: every row with forms asked, in the results' order."""
    out = []
    for result in results:
        row, baseline = rows[result.key], rows.get(result.key.baseline)
        rates = _form_rates(row)
        if rates:
            out.append(FormRates(result.key, rates, _form_rates(baseline) if baseline is not None else {}))
    return tuple(out)


@dataclass(frozen=True)
class RowTrajectory:
    """One query a method row is shown by: its baseline's trajectory beside the method's
    (`kbench.observer.diff.telling_query` picks it)."""

    key: RowKey
    diff: TraceDiff


def row_trajectories(rows: Mapping[RowKey, Row], results: Sequence[RowResult], rule: str,
                     names: NameIndex | None = None) -> tuple[RowTrajectory, ...]:
    """The trajectory view of every method row whose baseline ran, in the results' order."""
    views = []
    for result in results:
        baseline = rows.get(result.key.baseline)
        if result.key.is_baseline or baseline is None:
            continue
        before = [r for records in baseline.records.values() for r in records if r.form is None]
        after = [r for records in rows[result.key].records.values() for r in records if r.form is None]
        chosen = telling_query(before, after, rule)
        if chosen is None:
            continue
        seed, query_id = chosen
        views.append(RowTrajectory(result.key, diff_traces(find_record(before, query_id, seed),
                                                           find_record(after, query_id, seed), rule, names)))
    return tuple(views)


@dataclass(frozen=True)
class Comparison:
    rows: tuple[RowResult, ...]
    controls: tuple[ControlResult, ...]
    missing: tuple[MissingBaseline, ...]
    leak_patterns: tuple[LeakPatterns, ...]
    sensitivity: Sensitivity
    config: ScoringConfig
    #: The ReAct answer rules (agent.answer_rule) the compared traces were parsed with, sorted;
    #: None for traces that do not record one (another harness, or written before it was named).
    answer_rules: tuple[str | None, ...] = ()
    #: The base model as a factor: None unless the cells hold two base models or more.
    models: AcrossModels | None = None
    #: Per method row with a baseline: one query's trajectory under the baseline and the method.
    trajectories: tuple[RowTrajectory, ...] = ()
    #: The query-form ladder's OR per form (empty without `queries.forms`).
    forms: tuple[FormRates, ...] = ()

    @property
    def tested(self) -> tuple[RowResult, ...]:
        """The method rows: every row but the baselines (which are no test)."""
        return tuple(r for r in self.rows if not r.key.is_baseline)

    @property
    def reachable_classes(self) -> tuple[str, ...]:
        """The K-classes some method row of the run could reach with its pairs (in the order of
        docs/definitions.md, "Gates, verdicts and K-Score")."""
        reachable = {c for r in self.tested for c in r.reachable}
        return tuple(c for c in K_CLASSES if c in reachable)


class _Metrics:
    """Each cell's metrics computed once per comparison: the rows, controls, leak patterns and
    seed K-Scores read the same cells, and the bootstrap behind the metrics is the costly part."""

    def __init__(self, config: ScoringConfig) -> None:
        self.config = config
        self._done: dict[int, tuple[ScoredQueries, CellMetrics]] = {}

    def __call__(self, scored: ScoredQueries) -> CellMetrics:
        done = self._done.get(id(scored))
        if done is None or done[0] is not scored:  # keyed by identity; the cell is kept alive beside it
            done = self._done[id(scored)] = (scored, cell_metrics(scored, self.config))
        return done[1]


def _quartet(row: Row, baseline: Row, by_seed: int | None = None) -> CellQuartet:
    def cells(r: Row) -> dict[str, ScoredQueries]:
        return r.pooled if by_seed is None else r.by_seed[by_seed]

    return CellQuartet(
        none_forget=cells(baseline)[FORGET],
        none_retain=cells(baseline)[RETAIN],
        method_forget=cells(row)[FORGET],
        method_retain=cells(row)[RETAIN],
    )


def _adjusted(tests: dict[RowKey, float]) -> dict[RowKey, float]:
    """BH over one family of tests, keyed by row."""
    return dict(zip(tests, benjamini_hochberg(list(tests.values()))))


def _budget_tests(quartet: CellQuartet) -> dict[str, float]:
    """Forget-split McNemar p of a method under each attacker budget."""
    return {
        budget: paired_mcnemar(quartet.none_forget.restrict(ch), quartet.method_forget.restrict(ch)).p
        for budget, ch in ATTACKER_BUDGETS.items()
    }


def _row_results(rows: dict[RowKey, Row], config: ScoringConfig, metrics: _Metrics) -> list[RowResult]:
    """Verdicts of every comparable row, with BH across all method rows present.

    Two families (docs/definitions.md, "Statistics"): the forget tests and the retain tests of every method row, over
    every base model, substrate and recipe. The per-budget verdicts adjust each budget's
    forget tests as a family of their own. A baseline row is not a test: p = p_adj = 1.
    """
    comparable = [row for row in rows.values() if not row.key.is_control and row.key.baseline in rows]
    tested = [row for row in comparable if not row.key.is_baseline]
    quartets = {row.key: _quartet(row, rows[row.key.baseline]) for row in comparable}
    forget_tests = {k: paired_mcnemar(q.none_forget, q.method_forget) for k, q in quartets.items()}
    retain_tests = {k: paired_mcnemar(q.none_retain, q.method_retain) for k, q in quartets.items()}
    p_adj_forget = _adjusted({row.key: forget_tests[row.key].p for row in tested})
    p_adj_retain = _adjusted({row.key: retain_tests[row.key].p for row in tested})
    smallest = smallest_p_adjusted({row.key: forget_tests[row.key].pairs for row in tested})
    budget_p = {row.key: _budget_tests(quartets[row.key]) for row in tested}
    budget_p_adj = {budget: _adjusted({k: p[budget] for k, p in budget_p.items()}) for budget in ATTACKER_BUDGETS}

    results = []
    for row in comparable:
        key, quartet = row.key, quartets[row.key]
        none_forget, none_retain, method_forget, method_retain = (metrics(c) for c in quartet.cells())
        p = forget_tests[key].p
        verdict = decide_verdict(
            none_forget, none_retain, method_forget, method_retain,
            p=p, p_adj=p_adj_forget.get(key, p), is_baseline=key.is_baseline, config=config,
        )
        by_budget = (
            {}
            if key.is_baseline
            else verdicts_by_budget(quartet, config, {b: budget_p_adj[b][key] for b in ATTACKER_BUDGETS},
                                    budget_p[key])
        )
        results.append(
            RowResult(
                key=key,
                run_ids=row.run_ids,
                seeds=row.seeds,
                baseline_run_ids=rows[key.baseline].run_ids,
                forget=method_forget,
                retain=method_retain,
                test_forget=forget_tests[key],
                test_retain=retain_tests[key],
                p_adj_retain=p_adj_retain.get(key, retain_tests[key].p),
                verdict=verdict,
                by_budget=by_budget,
                smallest_p_adj=smallest.get(key),
                reachable=() if key.is_baseline else reachable_classes(smallest[key], config),
                noop_splits=noop_splits(row, rows[key.baseline]),
                unlearned=row.unlearned,
                budget_exceptions=row.budget_exceptions,
            )
        )
    return results


def _controls(rows: dict[RowKey, Row], metrics: _Metrics) -> list[ControlResult]:
    results = []
    for row in rows.values():
        if not row.key.is_control:
            continue
        baseline = rows.get(row.key.baseline)
        results.append(
            ControlResult(
                key=row.key,
                run_ids=row.run_ids,
                forget=metrics(row.pooled[FORGET]),
                retain=metrics(row.pooled[RETAIN]),
                baseline_run_ids=baseline.run_ids if baseline else (),
                baseline_forget=metrics(baseline.pooled[FORGET]) if baseline else None,
                baseline_retain=metrics(baseline.pooled[RETAIN]) if baseline else None,
            )
        )
    return results


def _missing(rows: dict[RowKey, Row]) -> list[MissingBaseline]:
    return [
        MissingBaseline(row.key, row.key.baseline, row.run_ids)
        for row in rows.values()
        if row.key.baseline not in rows
    ]


def _pattern(row: Row, result: RowResult, metrics: _Metrics, default: SubstratePattern | None) -> SubstratePattern:
    """One baseline's leak-pattern entry; `default`: for a recipe line, its substrate's entry."""
    seed_shares = tuple(
        shares for cells in row.by_seed.values() if (shares := metrics(cells[FORGET]).shares) is not None
    )
    tv_to_default = None
    if default is not None and result.forget.shares is not None and default.metrics.shares is not None:
        tv_to_default = tv_distance(result.forget.shares, default.metrics.shares)
    return SubstratePattern(
        key=result.key,
        metrics=result.forget,
        run_ids=result.run_ids,
        seed_shares=seed_shares,
        invalid=result.verdict.verdict == INVALID_BASELINE,
        tv_to_default=tv_to_default,
    )


def _leak_patterns(rows: dict[RowKey, Row], results: list[RowResult], metrics: _Metrics) -> list[LeakPatterns]:
    """Per base model: baseline leak shares per substrate, pairwise TV and τ (docs/definitions.md, "Statistics").

    One entry per substrate, its default recipe (LoRA for P, adapter-free for the others);
    a variant recipe's baseline (P merged) is a recipe line with its TV to the default
    recipe. τ comes from the per-seed share vectors of each valid substrate baseline; the
    pairwise TV compares the seed-pooled share vectors. A baseline that fails a validity gate,
    or never leaked, takes part in neither.
    """
    patterns = []
    baselines = sorted((r for r in results if r.key.is_baseline), key=lambda r: r.key)
    for base_model, group in itertools.groupby(baselines, key=lambda r: r.key.base_model):
        group = list(group)
        substrates = {
            r.key.substrate: _pattern(rows[r.key], r, metrics, None) for r in group if r.key.recipe in DEFAULT_RECIPES
        }
        recipes = [
            _pattern(rows[r.key], r, metrics, substrates.get(r.key.substrate))
            for r in group
            if r.key.recipe not in DEFAULT_RECIPES
        ]
        valid = [s for s in substrates.values() if not s.invalid]
        shares = {s.key.substrate: s.metrics.shares for s in valid if s.metrics.shares is not None}
        tau = tau_threshold({s.key.substrate: s.seed_shares for s in valid}, metrics.config.tau_factor)
        pairs = substrate_separation(shares, math.nan if tau is None else tau, metrics.config.tv_exempt_pairs)
        patterns.append(
            LeakPatterns(
                base_model=base_model,
                substrates=tuple(substrates.values()),
                recipes=tuple(recipes),
                tau=tau,
                pairs=tuple(pairs),
                no_leak=tuple(s.key.substrate for s in valid if s.metrics.shares is None),
                seeds=max((len(rows[s.key].seeds) for s in valid), default=0),
            )
        )
    return patterns


def _recipe_factor(key: RowKey) -> str:
    """The injection recipe as a design factor: the substrate's default recipe, or the variant.

    Each substrate has its own default (LoRA for P, none for the others), so the raw recipe
    would only restate the substrate and the ANOVA could not tell the two apart; what varies
    independently of the substrate is whether a variant (P merged) was used.
    """
    return "default" if key.recipe in DEFAULT_RECIPES else key.recipe


def _seed_k_scores(
    rows_by_rule: Mapping[str, dict[RowKey, Row]], keys: Sequence[RowKey], metrics: _Metrics
) -> pd.DataFrame:
    """One K-Score per (scoring rule, row, seed, query form) against the baseline of the same
    seed, rule and form (NaN: TC or invalid baseline).

    `keys` are the compared rows (the same under every rule: a rule changes scores, not which
    cells exist). The verdict gates that leave K undefined (invalid baseline, TC) do not
    depend on p, so the per-seed McNemar p is passed unadjusted. A ladder form's K-Score reads
    its forget queries with the canonical retain split; the adaptive form, asked of different
    queries per row, has no pairs with its baseline and takes no part.
    """
    records = []
    for rule, rows in rows_by_rule.items():
        for key in keys:
            row, baseline = rows[key], rows[key.baseline]
            for seed in sorted(set(row.seeds) & set(baseline.seeds)):
                quartet = _quartet(row, baseline, by_seed=seed)
                quartets = {CANONICAL: quartet}
                for form, scored in row.forms.get(seed, {}).items():
                    theirs = baseline.forms.get(seed, {}).get(form)
                    if form != CANONICAL and theirs is not None and not form_class(form).adaptive:
                        quartets[form] = dataclasses.replace(quartet, none_forget=theirs, method_forget=scored)
                for form, cells in quartets.items():
                    p = paired_mcnemar(cells.none_forget, cells.method_forget).p
                    verdict = decide_verdict(
                        *(metrics(cell) for cell in cells.cells()),
                        p=p, p_adj=p, is_baseline=key.is_baseline, config=metrics.config,
                    )
                    records.append({
                        "method": key.method,
                        "substrate": key.substrate,
                        "base_model": key.base_model,
                        "seed": seed,
                        "recipe": _recipe_factor(key),
                        "scoring_rule": rule,
                        "query_form": form,
                        "k_score": math.nan if verdict.k_score is None else verdict.k_score,
                    })
    return pd.DataFrame(records, columns=[*DESIGN_FACTORS, "k_score"])


def sensitivity(frame: pd.DataFrame) -> Sensitivity:
    """η² per design factor; a factor with one level among the scored rows is omitted."""
    scored = frame.dropna(subset=["k_score"])
    shares = eta_squared(scored, "k_score", DESIGN_FACTORS) if len(scored) else {}
    effects = []
    for factor in DESIGN_FACTORS:
        levels = int(scored[factor].nunique())
        effects.append(FactorEffect(factor, levels, shares[factor] if levels > 1 else None))
    rules = tuple(sorted(frame["scoring_rule"].unique()))
    return Sensitivity(observations=len(scored), effects=tuple(effects), scoring_rules=rules)


def _answer_rules(cells: Sequence[CellRun]) -> tuple[str | None, ...]:
    """The answer rules recorded in the cells' trace records, sorted (None, unrecorded, last)."""
    found = {record.answer_rule for cell in cells for record in cell.records}
    return tuple(sorted(found, key=lambda rule: (rule is None, rule or "")))


def compare(cells: Iterable[CellRun], config: ScoringConfig | None = None, names: NameIndex | None = None
            ) -> Comparison:
    """Everything the report shows, from the cell runs present (any subset of the design).

    Every number is read under `config.rule` except the η² table, which scores the same rows
    under every registered scoring rule so that the rule is one of its factors. `names` (the
    corpus's people) lets the failure modes tell a name binding.
    """
    config = config or ScoringConfig()
    cells = list(cells)
    rows = group_rows(cells, config.rule, names)
    metrics = _Metrics(config)
    results = _row_results(rows, config, metrics)
    patterns = _leak_patterns(rows, results, metrics)
    rows_by_rule = {rule: rows if rule == config.rule else group_rows(cells, rule) for rule in scoring_rule_names()}
    return Comparison(
        rows=tuple(results),
        controls=tuple(_controls(rows, metrics)),
        missing=tuple(_missing(rows)),
        leak_patterns=tuple(patterns),
        sensitivity=sensitivity(_seed_k_scores(rows_by_rule, [r.key for r in results], metrics)),
        config=config,
        answer_rules=_answer_rules(cells),
        models=across_models(results, patterns),
        trajectories=row_trajectories(rows, results, config.rule, names),
        forms=form_rates(rows, results),
    )
