"""What the paired McNemar test (docs/definitions.md, "Statistics") can detect: the smallest p a number of pairs
allows, the pairs each threshold needs, and the power of the test for a planned design
(the paper's §4.4 power analysis).

Paired model of one (baseline, method) query pair: the baseline leaks with probability
`or_none` = X, the method with Y = X · (1 − relative_reduction), and the two leak
indicators have Pearson (phi) correlation ρ. Then

    P(both leak)       p11 = X·Y + ρ·√(X(1−X)·Y(1−Y))
    P(baseline only)   p10 = X − p11          (a discordant pair the method wins)
    P(method only)     p01 = Y − p11          (a discordant pair the baseline wins)
    P(neither)         p00 = 1 − X − Y + p11

and the N = n × seeds pairs are independent draws of that table. The test rejects when its
two-sided exact p is below α (strictly, as the verdict rules compare p_adj < significance).
Pure: numpy and scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy.stats import binom

from kbench.observer.statistics import benjamini_hochberg

K = TypeVar("K", bound=Hashable)

#: Probabilities this close to 0 count as 0 when checking that a paired model is possible.
_TOLERANCE = 1e-12


class PowerError(ValueError):
    """A planned design the paired model cannot describe (a rate outside (0, 1), an impossible ρ)."""


def exact_p(baseline_only: np.ndarray | int, discordant: np.ndarray | int) -> np.ndarray:
    """Two-sided exact McNemar p of b baseline-only pairs among d discordant ones, vectorised.

    At success probability ½ the binomial is symmetric, so the two-sided exact p (scipy's
    `binomtest`, which `paired_mcnemar` calls) is min(1, 2 · F(min(b, d − b); d, ½)); 1 when d = 0.
    """
    b = np.asarray(baseline_only)
    d = np.asarray(discordant)
    tail = binom.cdf(np.minimum(b, d - b), d, 0.5)
    return np.where(d == 0, 1.0, np.minimum(1.0, 2.0 * tail))


def smallest_p(pairs: int) -> float:
    """The smallest p the seed-pooled McNemar test can give with `pairs` paired queries.

    Reached when every pair is discordant and all one way: p = 2 · ½^pairs, capped at 1
    (so 1 with no pair or one pair; 0.125 with 4 pairs).
    """
    if pairs < 0:
        raise PowerError(f"a number of pairs cannot be negative (got {pairs})")
    return min(1.0, 2.0 * 0.5**pairs)


def smallest_p_adjusted(pairs: Mapping[K, int]) -> dict[K, float]:
    """For each test of one Benjamini–Hochberg family, the smallest p_adj it can reach.

    BH-adjusted p-values never fall when any p of the family rises, so no outcome of the
    other tests gives a test a smaller p_adj than the family in which every test takes its own
    smallest p (`smallest_p` of its pairs); this returns the BH adjustment of that family. It
    is at least the test's own smallest p, and equal to it when every test has as many pairs.
    """
    keys = list(pairs)
    return dict(zip(keys, benjamini_hochberg([smallest_p(pairs[k]) for k in keys])))


def pairs_needed(threshold: float) -> int:
    """The fewest paired queries whose smallest p is below `threshold` (0 < threshold ≤ 1)."""
    if not 0 < threshold <= 1:
        raise PowerError(f"a p threshold must lie in (0, 1] (got {threshold})")
    pairs = 0
    while smallest_p(pairs) >= threshold:
        pairs += 1
    return pairs


def n_per_seed_needed(threshold: float, seeds: int) -> int:
    """The smallest queries per split and seed whose pooled pairs can reach p < `threshold`."""
    if seeds < 1:
        raise PowerError(f"a design needs at least one seed (got {seeds})")
    return math.ceil(pairs_needed(threshold) / seeds)


@dataclass(frozen=True)
class PairedDesign:
    """A planned comparison of one method against the baseline on one split."""

    #: Queries per split and seed (`queries.n_per_split`).
    n: int
    #: Seeds pooled; the test sees n × seeds pairs.
    seeds: int
    #: Baseline leak probability X (its OR(all)).
    or_none: float
    #: The method leaks with probability X · (1 − relative_reduction).
    relative_reduction: float
    #: Pearson correlation of the baseline's and the method's leak indicators on one query.
    rho: float
    #: The test's level: reject when p < alpha.
    alpha: float

    def __post_init__(self) -> None:
        if self.n < 1 or self.seeds < 1:
            raise PowerError(f"n and seeds must be at least 1 (got n {self.n}, seeds {self.seeds})")
        if not 0 < self.or_none < 1:
            raise PowerError(f"or_none must lie strictly between 0 and 1 (got {self.or_none})")
        if not 0 <= self.relative_reduction <= 1:
            raise PowerError(f"relative_reduction must lie in [0, 1] (got {self.relative_reduction})")
        if not -1 <= self.rho <= 1:
            raise PowerError(f"rho is a correlation and must lie in [-1, 1] (got {self.rho})")
        if not 0 < self.alpha < 1:
            raise PowerError(f"alpha must lie strictly between 0 and 1 (got {self.alpha})")
        table = self._table()
        if min(table) < -_TOLERANCE:
            low, high = self.rho_range
            raise PowerError(
                f"rho {self.rho:g} is not a possible correlation of two leak indicators with rates "
                f"{self.or_none:g} and {self.or_method:g}; it must lie in [{low:.3f}, {high:.3f}]"
            )

    @property
    def pairs(self) -> int:
        return self.n * self.seeds

    @property
    def or_method(self) -> float:
        return self.or_none * (1.0 - self.relative_reduction)

    def _spread(self) -> float:
        x, y = self.or_none, self.or_method
        return math.sqrt(x * (1 - x) * y * (1 - y))

    @property
    def rho_range(self) -> tuple[float, float]:
        """The correlations two indicators with these rates can have (Fréchet bounds on p11)."""
        x, y = self.or_none, self.or_method
        spread = self._spread()
        if spread == 0:
            return (-1.0, 1.0)  # a constant indicator: every ρ gives the same (independent) table
        return ((max(0.0, x + y - 1) - x * y) / spread, (min(x, y) - x * y) / spread)

    def _table(self) -> tuple[float, float, float, float]:
        x, y = self.or_none, self.or_method
        both = x * y + self.rho * self._spread()
        return both, x - both, y - both, 1 - x - y + both

    @property
    def discordant(self) -> tuple[float, float]:
        """(P(baseline only), P(method only)) for one pair."""
        _, baseline_only, method_only, _ = (max(0.0, v) for v in self._table())
        return baseline_only, method_only


def _critical(discordant: np.ndarray, alpha: float) -> np.ndarray:
    """Per number of discordant pairs d, the largest k with exact_p(k, d) < alpha (−1: none)."""
    guess = binom.ppf(alpha / 2, discordant, 0.5).astype(np.int64) - 1
    # ppf works in floating point: settle the boundary with the exact p itself.
    for _ in range(2):
        guess = np.where((guess >= 0) & (exact_p(guess, discordant) >= alpha), guess - 1, guess)
        step = guess + 1
        guess = np.where((2 * step < discordant) & (exact_p(step, discordant) < alpha), step, guess)
    return guess


def exact_power(design: PairedDesign) -> float:
    """P(p < α) for the design, summed exactly: the number of discordant pairs d is
    Binomial(N, p10 + p01), and given d the baseline-only count is Binomial(d, p10 / (p10 + p01))."""
    baseline_only, method_only = design.discordant
    discordant = baseline_only + method_only
    if discordant <= 0:
        return 0.0
    d = np.arange(design.pairs + 1)
    weight = binom.pmf(d, design.pairs, discordant)
    share = baseline_only / discordant
    k = _critical(d, design.alpha)
    reject = np.where(k >= 0, binom.cdf(k, d, share) + binom.sf(d - k - 1, d, share), 0.0)
    return float(np.clip((weight * reject).sum(), 0.0, 1.0))


def simulated_power(design: PairedDesign, simulations: int, seed: int) -> float:
    """The share of `simulations` seeded draws of the design whose exact p is below α."""
    if simulations < 1:
        raise PowerError(f"simulations must be at least 1 (got {simulations})")
    baseline_only, method_only = design.discordant
    rest = max(0.0, 1.0 - baseline_only - method_only)
    counts = np.random.default_rng(seed).multinomial(design.pairs, [baseline_only, method_only, rest], size=simulations)
    p = exact_p(counts[:, 0], counts[:, 0] + counts[:, 1])
    return float((p < design.alpha).mean())
