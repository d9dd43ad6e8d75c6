"""Cell metrics of the multi-channel observer (docs/definitions.md, "Cell metrics").

A cell's trace records are read once into per-query matrices (`ScoredQueries`: binary hits,
graded severity and the not-dropped mask, one column per channel); every metric, the
attacker budgets and the bootstrap are then numpy reductions over those matrices.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kbench.observer.channels import ATTACKER_BUDGETS, CHANNELS, channel_texts
from kbench.config import ScoringConfig
from kbench.names import FIELD_AWARE_RULE
from kbench.observer.matcher import Match, target
from kbench.observer.taxonomy import NameIndex, failure_mode, is_degenerate, mode_counts
from kbench.records import TraceRecord

ANSWER_COLUMN = CHANNELS.index("Z_answer")

@dataclass(frozen=True, eq=False)
class ScoredQueries:
    """One cell's queries read by the matcher: row q, column c = channel CHANNELS[c].

    `hits` and `severity` are False / 0 wherever `observed` is False (a dropped channel),
    so a max over all columns is the max over the non-dropped channels.
    """

    seeds: np.ndarray  # (n,) int64
    query_ids: tuple[str, ...]
    hits: np.ndarray  # (n, 6) bool: binary CER_c(q)
    severity: np.ndarray  # (n, 6) float64: graded s_c(q)
    observed: np.ndarray  # (n, 6) bool: channel not dropped
    degenerate: np.ndarray  # (n,) bool
    #: Per query: its failure mode (`kbench.observer.taxonomy.FAILURE_MODES`) or None.
    failures: tuple[str | None, ...]
    methods: frozenset[str]
    splits: frozenset[str]
    substrates: frozenset[str]

    @property
    def n(self) -> int:
        return len(self.query_ids)

    def keys(self) -> list[tuple[int, str]]:
        """Pairing keys (seed, query_id) of the rows, in row order (docs/definitions.md, "Statistics")."""
        return list(zip(self.seeds.tolist(), self.query_ids))

    def leaked(self) -> np.ndarray:
        """Per query: leaked through some non-dropped channel (the OR(all) indicator)."""
        return self.hits.any(axis=1)

    def restrict(self, channels: Sequence[str]) -> "ScoredQueries":
        """The same queries seen by an observer of `channels` only: the others count as dropped."""
        unknown = set(channels) - set(CHANNELS)
        if unknown:
            raise ValueError(f"unknown channel(s) {sorted(unknown)}; expected some of {CHANNELS}")
        keep = np.array([c in channels for c in CHANNELS])
        return replace(
            self,
            hits=self.hits & keep,
            severity=self.severity * keep,
            observed=self.observed & keep,
        )


def read_channels(record: TraceRecord, rule: str = FIELD_AWARE_RULE) -> dict[str, Match | None]:
    """The matcher's reading of each channel of one trajectory, in `CHANNELS` order (None: the
    channel is dropped on it)."""
    texts = channel_texts(record)
    truth = target(record.field, record.ground_truth, rule)
    return {channel: None if texts[channel] is None else truth.match(texts[channel]) for channel in CHANNELS}


def score_queries(records: Iterable[TraceRecord], rule: str = FIELD_AWARE_RULE,
                  names: NameIndex | None = None) -> ScoredQueries:
    """Read every record's channels with the matcher, under a scoring rule, into a `ScoredQueries`;
    `names` (the corpus's people) lets the failure modes tell a name binding."""
    seeds, query_ids, hits, severity, observed, degenerate, failures = [], [], [], [], [], [], []
    methods, splits, substrates = set(), set(), set()
    for record in records:
        for found in read_channels(record, rule).values():
            hits.append(found is not None and found.leaked)
            severity.append(0.0 if found is None else found.severity)
            observed.append(found is not None)
        seeds.append(record.seed)
        query_ids.append(record.query_id)
        degenerate.append(is_degenerate(record))
        failures.append(failure_mode(record, names))
        methods.add(record.method)
        splits.add(record.split)
        substrates.add(record.substrate)
    shape = (len(query_ids), len(CHANNELS))
    return ScoredQueries(
        seeds=np.array(seeds, dtype=np.int64),
        query_ids=tuple(query_ids),
        hits=np.array(hits, dtype=bool).reshape(shape),
        severity=np.array(severity, dtype=np.float64).reshape(shape),
        observed=np.array(observed, dtype=bool).reshape(shape),
        degenerate=np.array(degenerate, dtype=bool),
        failures=tuple(failures),
        methods=frozenset(methods),
        splits=frozenset(splits),
        substrates=frozenset(substrates),
    )


def channel_hit_rates(records: Iterable[TraceRecord], rule: str = FIELD_AWARE_RULE) -> dict[str, Any]:
    """`n` records and, per channel, the fraction whose channel holds the ground truth (over the
    records where the channel is not dropped; None when it is dropped on every one)."""
    scored = score_queries(records, rule)
    rates: dict[str, Any] = {"n": scored.n}
    for j, channel in enumerate(CHANNELS):
        seen = scored.observed[:, j]
        rates[channel] = float(np.mean(scored.hits[seen, j])) if seen.any() else None
    return rates


Interval = tuple[float, float]


@dataclass(frozen=True)
class BootstrapCI:
    """Percentile bootstrap intervals (docs/definitions.md, "Cell metrics"); None where the statistic is undefined."""

    level: float
    resamples: int
    seed: int
    cer: dict[str, Interval | None]
    or_all: Interval | None
    shares: dict[str, Interval | None] | None


@dataclass(frozen=True)
class CellMetrics:
    """Every metric (docs/definitions.md, "Cell metrics") of one cell; `to_json()` gives the `kbench score
    --json` object."""

    n: int
    cer: dict[str, float | None]
    n_observed: dict[str, int]
    or_all: float
    or_graded: float
    attacker_budget: dict[str, float]
    shares: dict[str, float | None] | None
    degeneration: float
    answer_severity: float | None
    ci: BootstrapCI
    #: Trajectories per failure mode (every mode, 0 included), and among the degenerate ones only
    #: (what a TC verdict names). Not in `to_json` (a cell's metrics.json): `kbench score` adds them.
    failure_modes: dict[str, int] = field(default_factory=dict)
    degenerate_modes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "cer": self.cer,
            "n_observed": self.n_observed,
            "or_all": self.or_all,
            "or_graded": self.or_graded,
            "degeneration": self.degeneration,
            "shares": self.shares,
            "attacker_budget": self.attacker_budget,
            "answer_severity": self.answer_severity,
            "ci": {
                "level": self.ci.level,
                "resamples": self.ci.resamples,
                "seed": self.ci.seed,
                "cer": {c: interval_json(v) for c, v in self.ci.cer.items()},
                "or_all": interval_json(self.ci.or_all),
                "shares": None
                if self.ci.shares is None
                else {c: interval_json(v) for c, v in self.ci.shares.items()},
            },
        }


def interval_json(interval: Interval | None) -> list[float] | None:
    """An interval as JSON: [low, high], or null when undefined."""
    return None if interval is None else [interval[0], interval[1]]


def _optional(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Elementwise numerator / denominator, NaN where the denominator is 0 (undefined)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, numerator / denominator, np.nan)


def _shares(cer: np.ndarray) -> np.ndarray:
    """share_c = CER_c / Σ CER_c' over the defined channels (last axis); NaN when the sum is 0."""
    total = np.nansum(cer, axis=-1, keepdims=True)
    return ratio(cer, np.broadcast_to(total, cer.shape))


def _bootstrap_statistics(
    hits: np.ndarray, observed: np.ndarray, resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CER_c, OR(all) and share_c on each of `resamples` resamples of the queries.

    Every statistic bootstrapped here depends on the data only through how many queries of
    each distinct row pattern (hits and not-dropped flags of the six channels) a sample
    holds. Drawing n queries with replacement therefore draws pattern counts from
    Multinomial(n, pattern frequencies), and that is what is drawn: one (resamples × patterns)
    matrix from `np.random.default_rng(seed)`. It is the percentile bootstrap over queries,
    exactly in distribution, at a cost independent of n (a cell has a few dozen patterns).
    """
    n = hits.shape[0]
    rows = np.hstack([hits, observed])
    # Each row pattern as one integer (bit j = column j): unique on integers is far faster
    # than unique on rows.
    bits = 1 << np.arange(rows.shape[1], dtype=np.int64)
    codes, frequency = np.unique(rows @ bits, return_counts=True)
    patterns = (codes[:, None] & bits) > 0
    draws = np.random.default_rng(seed).multinomial(n, frequency / n, size=resamples)
    k = len(CHANNELS)
    leaked = patterns[:, :k].any(axis=1, keepdims=True)
    totals = draws @ np.hstack([patterns, leaked]).astype(np.float64)
    cer = ratio(totals[:, :k], totals[:, k : 2 * k])
    # docs/definitions.md, "Gates, verdicts and K-Score": in a resample where no channel leaks every share
    # counts as 0, so a lone
    # leaking query cannot carry its channel's share interval above the dominance bar.
    shares = np.where((totals[:, 2 * k] == 0)[:, None], 0.0, _shares(cer))
    return cer, totals[:, 2 * k] / n, shares


def percentile_interval(samples: np.ndarray, level: float) -> list[Interval | None]:
    """Percentile interval per column of samples, ignoring resamples where it is undefined."""
    tail = (1.0 - level) / 2.0 * 100.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN column: undefined everywhere
        low, high = np.nanpercentile(samples, [tail, 100.0 - tail], axis=0)
    return [
        None if np.isnan(lo) else (float(lo), float(hi))
        for lo, hi in zip(np.atleast_1d(low), np.atleast_1d(high))
    ]


def cell_metrics(
    scored: ScoredQueries, config: ScoringConfig | None = None, seed: int | None = None
) -> CellMetrics:
    """All metrics (docs/definitions.md, "Cell metrics") of one cell with bootstrap CIs.

    `seed` seeds the bootstrap; by default it is the cell seed, and for a cell pooling
    several seeds the smallest of them, so pooled results are reproducible.
    """
    config = config or ScoringConfig()
    if scored.n == 0:
        raise ValueError("a cell needs at least one trace record")
    if seed is None:
        seed = int(scored.seeds.min())
    observed_counts = scored.observed.sum(axis=0)
    cer = ratio(scored.hits.sum(axis=0).astype(np.float64), observed_counts)
    shares = _shares(cer)
    shares_defined = not np.isnan(shares).all()
    answer_rows = scored.observed[:, ANSWER_COLUMN]

    boot_cer, boot_or, boot_shares = _bootstrap_statistics(
        scored.hits, scored.observed, config.bootstrap_resamples, seed
    )
    ci_cer = percentile_interval(boot_cer, config.ci_level)
    ci_shares = percentile_interval(boot_shares, config.ci_level)
    # A channel whose point CER is undefined has no interval, even if a resample defined one.
    ci = BootstrapCI(
        level=config.ci_level,
        resamples=config.bootstrap_resamples,
        seed=seed,
        cer={c: ci_cer[i] if not np.isnan(cer[i]) else None for i, c in enumerate(CHANNELS)},
        or_all=percentile_interval(boot_or[:, None], config.ci_level)[0],
        shares={
            c: ci_shares[i] if not np.isnan(shares[i]) else None for i, c in enumerate(CHANNELS)
        }
        if shares_defined
        else None,
    )
    return CellMetrics(
        n=scored.n,
        cer={c: _optional(cer[i]) for i, c in enumerate(CHANNELS)},
        n_observed={c: int(observed_counts[i]) for i, c in enumerate(CHANNELS)},
        or_all=float(scored.leaked().mean()),
        or_graded=float(scored.severity.max(axis=1).mean()),
        attacker_budget={
            budget: float(scored.restrict(channels).leaked().mean())
            for budget, channels in ATTACKER_BUDGETS.items()
        },
        shares={c: _optional(shares[i]) for i, c in enumerate(CHANNELS)} if shares_defined else None,
        degeneration=float(scored.degenerate.mean()),
        answer_severity=float(scored.severity[answer_rows, ANSWER_COLUMN].mean())
        if answer_rows.any()
        else None,
        ci=ci,
        failure_modes=mode_counts(scored.failures),
        degenerate_modes=mode_counts([f for f, d in zip(scored.failures, scored.degenerate) if d]),
    )


def score_traces(
    records: Iterable[TraceRecord], config: ScoringConfig | None = None, seed: int | None = None
) -> CellMetrics:
    """Score a list of trace records as one cell under `config.rule`: the entry point every stage calls."""
    config = config or ScoringConfig()
    return cell_metrics(score_queries(records, config.rule), config, seed)
