"""The adaptive-consistency stopping rule: exact Beta values by hand, the Dirichlet Monte Carlo
against hand-integrated values, and what the counts may be."""

import math

import numpy as np
import pytest

from metagen.strategies.stopping import (
    beta_majority_probability,
    dirichlet_majority_probability,
    majority_probability,
    should_stop,
)


@pytest.mark.parametrize(("counts", "expected"), [
    ([], 1 / 2),  # Beta(1, 1): a fair coin
    ([0, 0], 1 / 2),
    ([1], 3 / 4),  # Beta(2, 1), density 2x: 1 − 1/4
    ([3], 15 / 16),
    ([4], 31 / 32),  # 1 − 2^−5: four agreeing answers pass 0.95, three do not
    ([2, 1], 11 / 16),  # P(Binomial(4, 1/2) <= 2)
    ([1, 3], 13 / 16),  # order does not matter: (3, 1) -> P(Binomial(5, 1/2) <= 3) = 26/32
    ([5, 5], 1 / 2),  # a tie: symmetric
    ([6, 1, 1], 247 / 256),  # only the top two count: P(Binomial(8, 1/2) <= 6)
])
def test_beta_rule_exact_values(counts, expected):
    assert beta_majority_probability(counts) == expected


def test_beta_rule_agrees_with_the_regularized_incomplete_beta():
    special = pytest.importorskip("scipy.special")
    for top in range(0, 30, 3):
        for second in range(0, top + 1, 2):
            assert beta_majority_probability([top, second]) == pytest.approx(
                1 - special.betainc(top + 1, second + 1, 0.5), abs=1e-12)


def test_the_beta_rule_reads_whole_counts_only():
    assert beta_majority_probability([4.0, 1.0]) == beta_majority_probability([4, 1])
    with pytest.raises(ValueError, match=r"counts=\[1.5, 1\] must be whole numbers for rule 'beta'"):
        beta_majority_probability([1.5, 1])
    with pytest.raises(ValueError, match=r"counts=\[2, -1\] is out of range"):
        beta_majority_probability([2, -1])


def _within(estimate, exact, samples):
    return abs(estimate - exact) <= 5 * math.sqrt(exact * (1 - exact) / samples)


@pytest.mark.parametrize(("counts", "exact"), [
    ([0, 0, 0], 1 / 3),  # Dirichlet(1, 1, 1): uniform on the simplex, each answer largest by symmetry
    ([1, 0, 0], 11 / 18),  # density 6·p1: ∫_{1/3}^{1/2} 6p(3p − 1) dp + ∫_{1/2}^{1} 6p(1 − p) dp = 1/9 + 1/2
    ([4], 31 / 32),  # padded to (4, 0): two answers, the Beta rule exactly
    ([3, 1], 13 / 16),
])
def test_dirichlet_rule_against_hand_integrated_values(counts, exact):
    samples = 40_000
    estimate = dirichlet_majority_probability(counts, np.random.default_rng(1), samples)
    assert _within(estimate, exact, samples)


def test_dirichlet_is_below_beta_with_more_rivals_and_seeded():
    # a third answer with votes makes the leader's lead over *every* rival less sure
    assert majority_probability([3, 1, 1], "dirichlet") < majority_probability([3, 1, 1], "beta")
    assert majority_probability([5, 2, 2], "dirichlet", seed=3) == majority_probability([5, 2, 2], "dirichlet", seed=3)
    assert majority_probability([2.5, 0.5], "dirichlet") > 0.5  # weighted votes are accepted


def test_should_stop_at_the_threshold():
    assert not should_stop([3], 0.95) and should_stop([4], 0.95)
    assert should_stop([3], 0.9375) and not should_stop([3], 0.94)  # >=: exactly 15/16 stops
    with pytest.raises(ValueError, match=r"threshold=1 is out of range: must be in \(0, 1\)"):
        should_stop([3], 1)
    with pytest.raises(ValueError, match="rule='mean' is not a stopping rule; choose from beta, dirichlet"):
        should_stop([3], 0.9, "mean")
