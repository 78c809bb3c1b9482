"""The mismatched tilt, α(Δ) and the KL-regularized optimum (a three-outcome tabular example)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.special import softmax
from scipy.stats import chisquare

from metagen.theory import (
    alpha_for_kl,
    bon_kl,
    bon_pmf,
    kl_divergence,
    kl_regularized_optimum,
    max_tilt_kl,
    tilt,
)

P = np.array([0.50, 0.30, 0.20])
Q = np.array([0.22, 0.11, 0.67])


def cross_entropy(a, b) -> float:
    return float(-np.sum(a * np.log(b)))


def test_seed_tilt_family_by_hand():
    assert tilt(P, Q, 0.0) == pytest.approx(P, abs=1e-15)
    # α = 1: p·q = (0.11, 0.033, 0.134), Z = 0.277
    assert tilt(P, Q, 1.0) == pytest.approx(np.array([0.11, 0.033, 0.134]) / 0.277, abs=1e-14)
    # α = 2: p·q² = (0.0242, 0.00363, 0.08978), Z = 0.11761
    assert tilt(P, Q, 2.0) == pytest.approx(np.array([0.0242, 0.00363, 0.08978]) / 0.11761, abs=1e-14)
    # α → ∞: all mass on argmax q, KL → −log p(argmax q) = log 5
    assert tilt(P, Q, 500.0) == pytest.approx([0, 0, 1], abs=1e-12)
    assert max_tilt_kl(P, Q) == pytest.approx(math.log(5))


def test_seed_family_moves_along_kl_and_reward_contours():
    alphas = np.linspace(0, 6, 31)
    kls = [kl_divergence(tilt(P, Q, a), P) for a in alphas]
    rewards = [cross_entropy(tilt(P, Q, a), Q) for a in alphas]  # H(π ‖ q), lower is better
    assert np.all(np.diff(kls) > 0) and np.all(np.diff(rewards) < 0)
    assert kls[0] == 0.0 and kls[-1] < math.log(5)


@pytest.mark.parametrize("delta", [0.0, 0.01, 0.3, 1.0, 1.6])
def test_alpha_for_kl_on_the_seed_example(delta):
    alpha = alpha_for_kl(P, Q, delta)
    assert kl_divergence(tilt(P, Q, alpha), P) == pytest.approx(delta, abs=1e-10)


def test_alpha_for_kl_out_of_reach():
    with pytest.raises(ValueError, match="out of reach"):
        alpha_for_kl(P, Q, math.log(5))
    with pytest.raises(ValueError, match="out of reach"):
        alpha_for_kl(P, Q, 2.0)
    with pytest.raises(ValueError, match=">= 0"):
        alpha_for_kl(P, Q, -0.1)
    with pytest.raises(ValueError, match="out of reach"):  # q flat on p's support: KL stays 0
        alpha_for_kl([0.5, 0.5, 0.0], [0.4, 0.4, 0.2], 0.1)


def test_tilt_matches_rejection_sampling():
    # draw y ~ p, accept with probability (q(y)/max q)^α: accepted draws follow the tilt
    rng = np.random.default_rng(0)
    alpha = 1.7
    draws = rng.choice(3, size=60_000, p=P)
    accepted = draws[rng.random(draws.size) < (Q[draws] / Q.max()) ** alpha]
    observed = np.bincount(accepted, minlength=3)
    assert chisquare(observed, tilt(P, Q, alpha) * accepted.size).pvalue > 1e-3


def test_kl_regularized_optimum_is_the_tilt_of_softmax_reward():
    r = np.array([0.0, 1.0, 3.0])
    for beta in (0.3, 1.0, 4.0):
        optimum = kl_regularized_optimum(P, r, beta)
        assert optimum.policy == pytest.approx(tilt(P, softmax(r), 1 / beta), abs=1e-12)
        assert optimum.expected_reward == pytest.approx(optimum.policy @ r)
        assert optimum.kl == pytest.approx(kl_divergence(optimum.policy, P))
    assert kl_regularized_optimum(P, r, 1e6).policy == pytest.approx(P, abs=1e-5)


@pytest.mark.parametrize("n", [2, 4, 16])
def test_best_of_n_lies_below_the_optimal_frontier(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        p = rng.dirichlet(np.ones(6))
        r = rng.normal(size=6)
        delta = bon_kl(p, r, n)
        bon_reward = bon_pmf(p, r, n) @ r
        beta = 1 / alpha_for_kl(p, softmax(r), delta)
        optimum = kl_regularized_optimum(p, r, beta)
        assert optimum.kl == pytest.approx(delta, abs=1e-9)
        assert optimum.expected_reward >= bon_reward - 1e-9


distributions = st.integers(2, 6).flatmap(
    lambda size: st.tuples(
        st.lists(st.floats(0.01, 1.0), min_size=size, max_size=size),
        st.lists(st.floats(0.01, 1.0), min_size=size, max_size=size),
    )
)


@settings(max_examples=80, deadline=None)
@given(distributions, st.floats(0.0, 0.99))
def test_alpha_inverts_kl(pair, fraction):
    p = np.array(pair[0]) / sum(pair[0])
    q = np.array(pair[1]) / sum(pair[1])
    reachable = max_tilt_kl(p, q)
    assume(reachable > 1e-6)
    delta = fraction * reachable
    alpha = alpha_for_kl(p, q, delta)
    assert alpha >= 0
    assert kl_divergence(tilt(p, q, alpha), p) == pytest.approx(delta, abs=1e-8)


@settings(max_examples=80, deadline=None)
@given(distributions, st.floats(0.05, 0.9), st.lists(st.floats(0.01, 1.0), min_size=6, max_size=6))
def test_tilt_is_optimal_in_its_kl_ball(pair, fraction, other):
    # Lemma 1: no φ with KL(φ ‖ p) ≤ Δ has a lower cross entropy H(φ ‖ q) than the tilt
    p = np.array(pair[0]) / sum(pair[0])
    q = np.array(pair[1]) / sum(pair[1])
    reachable = max_tilt_kl(p, q)
    assume(reachable > 1e-3)
    optimum = tilt(p, q, alpha_for_kl(p, q, fraction * reachable))
    phi = np.array(other[: len(p)]) / sum(other[: len(p)])
    for mix in np.linspace(0, 1, 11):  # a path from p towards φ, kept inside the ball
        candidate = (1 - mix) * p + mix * phi
        if kl_divergence(candidate, p) <= fraction * reachable:
            assert cross_entropy(candidate, q) >= cross_entropy(optimum, q) - 1e-9
