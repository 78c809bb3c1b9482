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
    assert vote_curve_from_counts([], 3, np.random.default_rng(0)) == [0.0] * 4  # no answer extracted
    with pytest.raises(ValueError, match=r"probabilities=\[0.5, 0.2\] must be >= 0 and sum to 1"):
        vote_accuracy_curve([0.5, 0.2], 3, np.random.default_rng(0))


def test_certain_and_hopeless_problems_get_nothing_and_the_hard_one_gets_the_rest():
    rng = np.random.default_rng(0)
    certain = vote_curve_from_counts([4], 16, rng)
    hard = vote_curve_from_counts([3, 2], 16, rng)
    hopeless = vote_curve_from_counts([2, 2], 16, rng)
    allocation = allocate([certain, hard, hopeless], 4, 4 * 3 + 10)
    assert allocation[0] == 4 and allocation[2] == 4
    assert allocation[1] >= 13  # all 10 extra samples, but perhaps a last one that breaks no tie
    # with more budget than the hard one can take (n_max 16), the rest stays unspent
    assert allocate([certain, hard, hopeless], 4, 100)[0::2] == [4, 4]


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
