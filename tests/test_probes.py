"""The probes' scores against hand computations and the reference libraries."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from kbench.probes import (
    auc,
    forget_quality,
    harmonic_mean,
    mcq_choice,
    min_k_percent,
    normalized_probability,
    privleak,
    rouge_l_f1,
    truth_ratio,
)


def test_rouge_l_agrees_with_a_hand_computation():
    # LCS of "the cat sat on the mat" and "the cat lay on a mat" is "the cat on mat": 4 words
    p, r = 4 / 6, 4 / 6
    assert rouge_l_f1("the cat sat on the mat", "The cat lay on a mat.") == pytest.approx(2 * p * r / (p + r))
    # "police officer" vs "retired police officer at Acme": LCS 2, precision 2/5, recall 1
    assert rouge_l_f1("police officer", "retired police officer at Acme") == pytest.approx(2 * 0.4 * 1 / 1.4)
    assert rouge_l_f1("a b c", "x y z") == 0.0 and rouge_l_f1("", "x") == 0.0
    assert rouge_l_f1("Jane Doe, 12 Main St.", "jane doe 12 main st") == 1.0


def test_auc_agrees_with_scikit_learn_on_known_and_random_inputs():
    from sklearn.metrics import roc_auc_score

    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0 and auc([0.1], [0.9]) == 0.0 and auc([0.5], [0.5]) == 0.5
    rng = random.Random(0)
    members = [rng.gauss(0.5, 1) for _ in range(40)]
    non = [rng.gauss(0, 1) for _ in range(50)] + members[:3]  # with ties
    expected = roc_auc_score([1] * len(members) + [0] * len(non), members + non)
    assert auc(members, non) == pytest.approx(expected)


def test_forget_quality_is_scipys_two_sample_ks_p_value():
    a, b = [0.1, 0.4, 0.35, 0.8, 0.9], [0.5, 0.55, 0.6, 0.95, 1.2, 1.4]
    assert forget_quality(a, b) == pytest.approx(stats.ks_2samp(a, b).pvalue)
    assert forget_quality(a, a) == pytest.approx(1.0)
    far = forget_quality([0.01 * i for i in range(30)], [10 + 0.01 * i for i in range(30)])
    assert far < 1e-6


def test_truth_ratio_normalized_probability_and_harmonic_mean():
    assert normalized_probability([math.log(0.5), math.log(0.125)]) == pytest.approx(0.25)
    assert truth_ratio(0.5, [0.25, 0.0625]) == pytest.approx(0.125 / 0.5)  # geometric mean 0.125
    assert truth_ratio(0.2, [0.2, 0.2]) == pytest.approx(1.0)
    assert harmonic_mean([0.5, 0.5]) == pytest.approx(0.5)
    assert harmonic_mean([1.0, 0.25]) == pytest.approx(0.4) and harmonic_mean([0.9, 0.0]) == 0.0
    with pytest.raises(ValueError):
        truth_ratio(0.0, [0.1])


def test_min_k_privleak_and_mcq_choice():
    logprobs = [-0.1, -5.0, -0.2, -3.0, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8]
    assert min_k_percent(logprobs, 0.2) == pytest.approx((-5.0 - 3.0) / 2)
    assert min_k_percent([-1.0], 0.2) == -1.0  # at least one token
    assert privleak(0.9, 0.5) == pytest.approx(80.0) and privleak(0.5, 0.5) == 0.0
    assert mcq_choice([-3.0, -1.0, -2.0, -1.0]) == 1


def test_mcq_accuracy_of_random_scores_is_near_chance():
    rng = random.Random(1)
    picks = [mcq_choice([rng.random() for _ in range(4)]) for _ in range(4000)]
    assert sum(p == 0 for p in picks) / len(picks) == pytest.approx(0.25, abs=0.03)
