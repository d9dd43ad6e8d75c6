"""Inferential statistics of K-Bench (docs/definitions.md, "Statistics"): paired McNemar, Benjamini–Hochberg,
TV distance between leak-share vectors, the pre-registered τ, and η² of K-Score factors.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests

from kbench.observer.metrics import ScoredQueries
from kbench.records import SPLITS

if TYPE_CHECKING:
    import pandas as pd

Shares = Mapping[str, float | None]


@dataclass(frozen=True)
class McNemarResult:
    """Seed-pooled paired McNemar test of a method cell against its baseline cell.

    `baseline_only`: pairs where the baseline leaked and the method did not (b);
    `method_only`: the reverse (c). Unpaired queries are counted but take no part.
    """

    pairs: int
    baseline_only: int
    method_only: int
    p: float
    unpaired_baseline: int
    unpaired_method: int


def _indexed(scored: ScoredQueries, role: str) -> dict[tuple[int, str], bool]:
    """Leak indicator by pairing key; a key seen twice would make the pairing ambiguous."""
    keys = scored.keys()
    index = dict(zip(keys, scored.leaked().tolist()))
    if len(index) != len(keys):
        (seed, query_id), _ = Counter(keys).most_common(1)[0]
        raise ValueError(
            f"the {role} cell has more than one record for seed {seed}, query_id {query_id}; "
            "each (seed, query_id) may occur once per cell"
        )
    return index


def mcnemar_p(baseline_only: int, method_only: int) -> float:
    """Exact two-sided McNemar p of b = `baseline_only` and c = `method_only` discordant pairs:
    a binomial test of b in b + c at 1/2 (1 when there are none)."""
    discordant = baseline_only + method_only
    return 1.0 if discordant == 0 else float(binomtest(baseline_only, discordant, 0.5).pvalue)


def paired_mcnemar(baseline: ScoredQueries, method: ScoredQueries) -> McNemarResult:
    """Exact two-sided McNemar on the OR(all) leak indicator (docs/definitions.md, "Statistics").

    Each method query is paired with the baseline query of the same (seed, query_id);
    discordant pairs are pooled over seeds and tested with an exact binomial test at 1/2
    (p = 1 when there are none). A query present in one cell only has no partner and is
    left out of the test; the counts of such queries are reported. Restricting both cells
    to an attacker budget first (`ScoredQueries.restrict`) gives the test at that budget.
    """
    base = _indexed(baseline, "baseline")
    meth = _indexed(method, "method")
    shared = base.keys() & meth.keys()
    baseline_only = sum(1 for k in shared if base[k] and not meth[k])
    method_only = sum(1 for k in shared if meth[k] and not base[k])
    return McNemarResult(
        pairs=len(shared),
        baseline_only=baseline_only,
        method_only=method_only,
        p=mcnemar_p(baseline_only, method_only),
        unpaired_baseline=len(base) - len(shared),
        unpaired_method=len(meth) - len(shared),
    )


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """BH-adjusted p-values of one family, in input order (statsmodels `fdr_bh`)."""
    if len(pvalues) == 0:
        return []
    return multipletests(np.asarray(pvalues, dtype=float), method="fdr_bh")[1].tolist()


def adjust_by_split(pvalues: Mapping[tuple[str, str, str], float]) -> dict[tuple[str, str, str], float]:
    """BH within the forget family and within the retain family, separately (docs/definitions.md, "Statistics").

    Keys are (substrate, method, split) as in docs/definitions.md, "Statistics"; each split's tests form one family.
    """
    unknown = {key[2] for key in pvalues} - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)} in test keys; expected {SPLITS}")
    adjusted: dict[tuple[str, str, str], float] = {}
    for split in SPLITS:
        family = [key for key in pvalues if key[2] == split]
        adjusted.update(zip(family, benjamini_hochberg([pvalues[k] for k in family])))
    return adjusted


def tv_distance(first: Shares, second: Shares) -> float:
    """½ Σ_c |s1_c − s2_c|; a channel missing or null in a vector carries share 0. Summed in
    channel-name order: a set's order follows the string hash seed, and float sums its order."""
    channels = sorted(set(first) | set(second))
    return 0.5 * sum(abs((first.get(c) or 0.0) - (second.get(c) or 0.0)) for c in channels)


def tau_threshold(baseline_shares_by_seed: Mapping[str, Sequence[Shares]], factor: float) -> float | None:
    """τ = factor × max over substrates of the mean TV between different seeds' baseline shares.

    `baseline_shares_by_seed[substrate]` lists the baseline's share vector of each seed; a
    substrate with fewer than two seeds has no between-seed TV. None when no substrate has one.
    """
    means = [
        float(np.mean([tv_distance(a, b) for a, b in itertools.combinations(vectors, 2)]))
        for vectors in baseline_shares_by_seed.values()
        if len(vectors) >= 2
    ]
    return factor * max(means) if means else None


@dataclass(frozen=True)
class SubstrateSeparation:
    """One substrate pair's baseline TV against τ (the leak-pattern hypothesis of docs/definitions.md, "Statistics")."""

    first: str
    second: str
    tv: float
    exempt: bool
    separated: bool


def substrate_separation(
    baseline_shares: Mapping[str, Shares], tau: float, exempt_pairs: Sequence[Sequence[str]]
) -> list[SubstrateSeparation]:
    """For every substrate pair, whether the baselines' share vectors differ by more than τ.

    The hypothesis holds when every non-exempt pair is separated.
    """
    exempt = {frozenset(pair) for pair in exempt_pairs}
    result = []
    for first, second in itertools.combinations(sorted(baseline_shares), 2):
        tv = tv_distance(baseline_shares[first], baseline_shares[second])
        result.append(
            SubstrateSeparation(first, second, tv, frozenset((first, second)) in exempt, tv > tau)
        )
    return result


def eta_squared(frame: pd.DataFrame, response: str, factors: Sequence[str]) -> dict[str, float]:
    """η² = SS_factor / SS_total per design factor from a linear-model ANOVA (docs/definitions.md, "Statistics").

    SS_factor is the type-II sum of squares of a main-effects least-squares fit: how much the
    residual sum of squares grows when that factor alone is dropped, so it does not depend on
    the order of the factors. SS_total is computed directly as Σ (y − ȳ)², which stays the
    right denominator when the design is unbalanced and the SS no longer add up. Rows with a
    missing response (TC, invalid baseline) are dropped; a factor with one level in the
    remaining rows explains nothing and gets η² = 0.

    The fits are plain least squares (numpy), so a saturated design (as many cells as
    parameters, as in a one-seed CPU run) or confounded factors (the recipe fixed by the
    substrate) still give an answer: a confounded factor has no unique share and scores 0.
    A formula-based ANOVA would instead fail on its F-tests, which η² does not need.
    """
    missing = [name for name in [response, *factors] if name not in frame.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the frame")
    data = frame.dropna(subset=[response])
    y = data[response].to_numpy(dtype=float)
    total = float(((y - y.mean()) ** 2).sum())
    varying = [f for f in factors if data[f].nunique() > 1]
    result = {f: 0.0 for f in factors}
    if not varying or total == 0.0:
        return result
    dummies = {f: _treatment_dummies(data[f].to_numpy()) for f in varying}
    full = _residual_ss(y, list(dummies.values()))
    for factor in varying:
        reduced = _residual_ss(y, [d for f, d in dummies.items() if f != factor])
        result[factor] = max(0.0, reduced - full) / total
    return result


def _treatment_dummies(levels: np.ndarray) -> np.ndarray:
    """One indicator column per level but the first (treatment coding beside an intercept)."""
    names = sorted({str(v) for v in levels})
    return np.array([[float(str(v) == name) for name in names[1:]] for v in levels]).reshape(len(levels), -1)


def _residual_ss(y: np.ndarray, blocks: list[np.ndarray]) -> float:
    """Residual sum of squares of y on an intercept and the given columns (rank-deficient safe)."""
    design = np.column_stack([np.ones(len(y)), *blocks])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    return float(residual @ residual)
