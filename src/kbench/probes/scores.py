"""The direct-elicitation probes' scores as pure functions over numbers a model produced
(docs/definitions.md, "Direct-elicitation probes"): no model and no I/O here, so each one is
checked against a hand computation or a reference library (tests/test_probes.py).

Directions: a higher length-normalized probability, KnowMem, VerbMem, MCQ accuracy or exact
match means more of the secret is still there; a truth ratio near 1 means the model cannot
tell the true answer from perturbed ones (TOFU's forget quality compares its distribution
with gold's: a high KS p-value means "like gold").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from scipy import stats

_WORD = re.compile(r"\w+", re.UNICODE)


def normalized_probability(token_logprobs: Sequence[float]) -> float:
    """TOFU's length-normalized answer probability: exp(mean token log-probability)."""
    if not token_logprobs:
        raise ValueError("an answer needs at least one token")
    return math.exp(sum(token_logprobs) / len(token_logprobs))


def truth_ratio(paraphrased: float, perturbed: Sequence[float]) -> float:
    """TOFU's truth ratio from length-normalized probabilities: the geometric mean of the
    perturbed answers' over the paraphrased answer's. Below 1: the model prefers the truth."""
    if not perturbed:
        raise ValueError("a truth ratio needs at least one perturbed answer")
    if paraphrased <= 0 or any(p <= 0 for p in perturbed):
        raise ValueError("probabilities must be positive")
    mean_log = sum(math.log(p) for p in perturbed) / len(perturbed)
    return math.exp(mean_log - math.log(paraphrased))


def forget_quality(model_ratios: Sequence[float], gold_ratios: Sequence[float]) -> float:
    """TOFU's forget quality: the two-sample Kolmogorov-Smirnov p-value between this model's
    forget truth ratios and the gold reference's (high: indistinguishable from gold)."""
    return float(stats.ks_2samp(list(model_ratios), list(gold_ratios)).pvalue)


def harmonic_mean(values: Sequence[float]) -> float:
    """TOFU's model utility aggregates its parts by the harmonic mean (0 if any part is 0)."""
    if not values:
        raise ValueError("a harmonic mean needs at least one value")
    if any(v < 0 for v in values):
        raise ValueError("harmonic mean of negative values")
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (ROUGE's tokenization, without stemming)."""
    return [w.lower() for w in _WORD.findall(text)]


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l_f1(reference: str, candidate: str) -> float:
    """ROUGE-L F1: the longest common word subsequence's F-measure (MUSE's KnowMem, VerbMem)."""
    ref, cand = words(reference), words(candidate)
    if not ref or not cand:
        return 0.0
    lcs = _lcs(ref, cand)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def min_k_percent(token_logprobs: Sequence[float], k: float) -> float:
    """Min-K% (Shi et al. 2024): the mean of the lowest k fraction of a text's token
    log-probabilities (at least one token). Higher: more likely a training member."""
    if not 0 < k <= 1:
        raise ValueError("k is a fraction in (0, 1]")
    if not token_logprobs:
        raise ValueError("a text needs at least one token")
    lowest = sorted(token_logprobs)[: max(1, int(len(token_logprobs) * k))]
    return sum(lowest) / len(lowest)


def auc(members: Sequence[float], non_members: Sequence[float]) -> float:
    """ROC AUC of a score separating members (positives) from non-members, ties counted half
    (the Mann-Whitney U statistic over the pairs)."""
    if not members or not non_members:
        raise ValueError("an AUC needs scores of both classes")
    wins = sum((m > n) + 0.5 * (m == n) for m in members for n in non_members)
    return wins / (len(members) * len(non_members))


def privleak(model_auc: float, gold_auc: float) -> float:
    """MUSE's PrivLeak: the membership AUC's relative distance from the retrained reference's,
    in percent ((AUC - AUC_gold) / AUC_gold x 100; near 0 is gold-like)."""
    if gold_auc <= 0:
        raise ValueError("the gold AUC must be positive")
    return (model_auc - gold_auc) / gold_auc * 100.0


def above_chance(correct: int, n: int, chance: float) -> float:
    """One-sided exact binomial p-value of `correct` of `n` right answers or more at `chance`."""
    if n <= 0:
        raise ValueError("a binomial test needs at least one item")
    return float(stats.binomtest(correct, n, chance, alternative="greater").pvalue)


def members_higher(members: Sequence[float], non_members: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value that members score higher than non-members (the AUC's test)."""
    if not members or not non_members:
        raise ValueError("the test needs scores of both classes")
    return float(stats.mannwhitneyu(list(members), list(non_members), alternative="greater").pvalue)


def mcq_choice(option_logprobs: Sequence[float]) -> int:
    """The option a model picks: the highest answer log-likelihood (the first on a tie)."""
    if not option_logprobs:
        raise ValueError("an MCQ needs options")
    return max(range(len(option_logprobs)), key=lambda i: (option_logprobs[i], -i))
