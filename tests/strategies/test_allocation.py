"""Compute-optimal allocation across problems: success curves checked by hand, and allocations
that are optimal by construction or by brute force."""

import itertools
import math

import numpy as np
import pytest

from metagen.strategies.allocation import (
    allocate,
    verifier_accuracy_curve,
    vote_accuracy_curve,
    vote_curve_from_counts,
)


def test_vote_curve_by_hand():
    samples = 40_000
    curve = vote_accuracy_curve([0.6, 0.4], 3, np.random.default_rng(0), samples)
    tolerance = 5 * 0.5 / math.sqrt(samples)
    assert curve[0] == 0.0
    assert curve[1] == pytest.approx(0.6**2 + 0.4**2, abs=tolerance)  # one draw: right with prob Σ p²
    win = 0.6**3 + 3 * 0.6**2 * 0.4  # the leader wins 2 of 3 or 3 of 3
    assert curve[3] == pytest.approx(0.6 * win + 0.4 * (1 - win), abs=tolerance)
    # one answer: certain; an even split: 1/K at every n (Σ_j P(j wins) = 1), exactly
    assert vote_accuracy_curve([1.0], 5, np.random.default_rng(0)) == [0.0] + [1.0] * 5
    assert vote_accuracy_curve([0.25] * 4, 5, np.random.default_rng(0)) == [0.0] + [0.25] * 5
    with pytest.raises(ValueError, match=r"probabilities=\[0.5, 0.2\] must be >= 0 and sum to 1"):
        vote_accuracy_curve([0.5, 0.2], 3, np.random.default_rng(0))


def test_the_posterior_curve_is_exact_for_one_answer_seen_once_and_zero_without_answers():
    """counts [1]: p_seen ~ Beta(1.5, 0.5) against the unseen class, so f(1) = E[p² + (1 − p)²]
    = 1 − 2·E[p(1 − p)] = 1 − 2·(1.5·0.5)/(2·3) = 0.75, not the plug-in's certainty."""
    samples = 40_000
    curve = vote_curve_from_counts([1], 2, np.random.default_rng(0), samples)
    assert curve[1] == pytest.approx(0.75, abs=5 * 0.5 / math.sqrt(samples))
    assert vote_curve_from_counts([], 3, np.random.default_rng(0)) == [0.0] * 4
    with pytest.raises(ValueError, match=r"alpha=0 is out of range: must be > 0"):
        vote_curve_from_counts([1], 2, np.random.default_rng(0), alpha=0)


def test_a_tie_is_not_hopeless_and_an_agreeing_round_gains_least():
    """From a first round of 4: a 2–2 tie gains about as much from 12 more samples as a 3–1 lead
    (the plug-in estimate gave it f ≡ 1/2, nothing to gain); four agreeing samples gain least."""
    rng = np.random.default_rng(0)
    certain, lead, tie = (vote_curve_from_counts(c, 16, rng, 40_000) for c in ([4], [3, 1], [2, 2]))
    gain = {name: curve[16] - curve[4] for name, curve in (("certain", certain), ("lead", lead), ("tie", tie))}
    assert gain["tie"] > 0.03 and gain["tie"] > 0.8 * gain["lead"]
    assert gain["certain"] < 0.5 * min(gain["tie"], gain["lead"])
    allocation = allocate([certain, lead, tie], 4, 4 * 3 + 10)
    assert allocation[2] > 4 and allocation[1] > 4 and sum(allocation) <= 22
    assert allocation[0] <= min(allocation[1], allocation[2])


def test_verifier_allocation_matches_brute_force():
    scores = [0.9, 0.5, 0.2, 0.05, 1.0, 0.0]
    curves = [verifier_accuracy_curve(s, 8) for s in scores]
    for budget in (6, 9, 14, 20, 30):
        chosen = allocate(curves, 1, budget)
        assert sum(chosen) <= budget and all(1 <= n <= 8 for n in chosen)
        best = max(sum(c[n] for c, n in zip(curves, ns)) for ns in itertools.product(range(1, 9), repeat=len(curves))
                   if sum(ns) <= budget)
        assert sum(c[n] for c, n in zip(curves, chosen)) == pytest.approx(best, abs=1e-12)
        assert chosen[4] == 1 and chosen[5] == 1  # a certain (ŝ = 1) and a hopeless (ŝ = 0) problem: no more


def test_equal_problems_share_equally_ties_to_the_first():
    curves = [verifier_accuracy_curve(0.5, 8)] * 2
    assert allocate(curves, 1, 6) == [3, 3]
    assert allocate(curves, 1, 5) == [3, 2]


def test_allocation_errors_name_the_field():
    curves = [verifier_accuracy_curve(0.5, 4)] * 3
    with pytest.raises(ValueError, match=r"budget=5 is out of range: the first round alone takes 6 \(2 per problem"):
        allocate(curves, 2, 5)
    with pytest.raises(ValueError, match=r"start=5 is out of range"):
        allocate(curves, 5, 20)
    with pytest.raises(ValueError, match=r"success=1.5 is out of range"):
        verifier_accuracy_curve(1.5, 4)
