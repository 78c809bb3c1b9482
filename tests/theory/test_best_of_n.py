"""Best-of-n closed forms against worked examples, brute-force enumeration and simulation."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from metagen.theory import bon_kl, bon_kl_bound, bon_kl_estimate, bon_pmf, bon_win_rate, kl_divergence, reward_cdf


def binary_entropy(x: float) -> float:
    return 0.0 if x in (0.0, 1.0) else -x * math.log(x) - (1 - x) * math.log(1 - x)


def enumerate_best_of_n(p, r, n):
    """π⁽ⁿ⁾ by summing over all Kⁿ draw tuples, each tied maximum winning with prob 1/#ties."""
    pmf = np.zeros(len(p))
    for draws in itertools.product(range(len(p)), repeat=n):
        weight = math.prod(p[i] for i in draws)
        best = max(r[i] for i in draws)
        winners = [i for i in draws if r[i] == best]
        for i in winners:
            pmf[i] += weight / len(winners)
    return pmf


def simulate_best_of_n(p, r, n, trials, rng):
    """The procedure itself: n draws, keep the highest reward, ties broken uniformly among draws."""
    draws = rng.choice(len(p), size=(trials, n), p=p)  # (trials, n)
    rank = np.unique(r, return_inverse=True)[1]  # dense reward rank of each outcome
    key = rank[draws] + rng.random((trials, n))  # integer rank, uniform tie-break in [0, 1)
    return draws[np.arange(trials), np.argmax(key, axis=1)]  # (trials,)


def random_instances(seed, count=6):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        size = int(rng.integers(2, 6))
        p = rng.dirichlet(np.ones(size))
        r = rng.integers(0, 3, size).astype(float)  # few reward levels: ties are common
        yield p, r


# ------------------------------------------------------------------ seed examples


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10])
def test_binary_example_of_the_seed(n):
    # p = (½, ½), r = (0, 1): π⁽ⁿ⁾ = (1/2ⁿ, 1 − 1/2ⁿ), KL = log 2 − h(1/2ⁿ)
    pmf = bon_pmf([0.5, 0.5], [0.0, 1.0], n)
    assert pmf == pytest.approx([0.5**n, 1 - 0.5**n], abs=1e-15)
    assert bon_kl([0.5, 0.5], [0.0, 1.0], n) == pytest.approx(math.log(2) - binary_entropy(0.5**n), abs=1e-14)
    assert bon_kl([0.5, 0.5], [0.0, 1.0], n) <= bon_kl_bound(n) + 1e-15


def test_bound_formula_values():
    assert bon_kl_bound(1) == 0.0
    assert bon_kl_bound(2) == pytest.approx(math.log(2) - 0.5)
    assert bon_kl_bound(100) == pytest.approx(math.log(100) - 0.99)


def test_tie_rule_by_hand():
    # tie class {0, 1} of mass 0.5 gets 1 − 0.5³ = 0.875, split 2 : 3 in proportion to p
    assert bon_pmf([0.2, 0.3, 0.5], [1, 1, 0], 3) == pytest.approx([0.35, 0.525, 0.125], abs=1e-15)
    # all rewards tied: best-of-n is the base policy
    assert bon_pmf([0.1, 0.6, 0.3], [2, 2, 2], 7) == pytest.approx([0.1, 0.6, 0.3], abs=1e-15)


def test_reward_cdf_with_ties():
    at_most, below = reward_cdf([0.1, 0.2, 0.3, 0.4], [5.0, 1.0, 5.0, 3.0])
    assert at_most == pytest.approx([1.0, 0.2, 1.0, 0.6])
    assert below == pytest.approx([0.6, 0.0, 0.6, 0.2])


# ------------------------------------------------------------------ exact agreement with enumeration


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_closed_forms_equal_enumeration_of_all_draws(seed, n):
    for p, r in random_instances(seed, count=4):
        pmf = enumerate_best_of_n(p, r, n)
        assert bon_pmf(p, r, n) == pytest.approx(pmf, abs=1e-12)
        assert bon_kl(p, r, n) == pytest.approx(kl_divergence(pmf, p), abs=1e-12)
        # win rate: y ~ π⁽ⁿ⁾ against z ~ p, ties count ½
        wins = sum(pmf[i] * p[j] * (1.0 if r[i] > r[j] else 0.5 if r[i] == r[j] else 0.0)
                   for i in range(len(p)) for j in range(len(p)))
        assert bon_win_rate(p, r, n) == pytest.approx(wins, abs=1e-12)


# ------------------------------------------------------------------ Monte Carlo of the procedure


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_pmf_matches_simulation_chi_square(n):
    rng = np.random.default_rng(1234 + n)
    trials = 20_000
    for p, r in random_instances(7 + n):
        chosen = simulate_best_of_n(p, r, n, trials, rng)
        observed = np.bincount(chosen, minlength=len(p))
        expected = bon_pmf(p, r, n) * trials
        support = expected > 0
        assert observed[~support].sum() == 0
        if support.sum() > 1:
            assert chisquare(observed[support], expected[support]).pvalue > 1e-3


@pytest.mark.parametrize("n", [1, 3, 8])
def test_win_rate_matches_simulation(n):
    rng = np.random.default_rng(99 + n)
    trials = 40_000
    for p, r in random_instances(30 + n, count=4):
        best = simulate_best_of_n(p, r, n, trials, rng)
        base = rng.choice(len(p), size=trials, p=p)
        score = np.where(r[best] > r[base], 1.0, np.where(r[best] == r[base], 0.5, 0.0))
        stderr = score.std() / math.sqrt(trials) + 1e-9
        assert abs(score.mean() - bon_win_rate(p, r, n)) < 4.5 * stderr


def test_kl_of_simulated_frequencies_is_close():
    # plug-in KL of the empirical best-of-n distribution converges to the closed form
    rng = np.random.default_rng(5)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    r = np.array([0.0, 1.0, 1.0, 2.0])
    chosen = simulate_best_of_n(p, r, 4, 200_000, rng)
    empirical = np.bincount(chosen, minlength=4) / chosen.size
    assert kl_divergence(empirical, p) == pytest.approx(bon_kl(p, r, 4), abs=5e-3)


# ------------------------------------------------------------------ bound, estimator, win-rate limit


def test_estimator_is_the_kl_of_an_atom_on_a_continuum():
    # top outcome of mass ε, the rest spread over m tiny outcomes of lower distinct rewards
    n, eps, m = 6, 0.05, 20_000
    p = np.concatenate([np.full(m, (1 - eps) / m), [eps]])
    r = np.arange(m + 1, dtype=float)
    assert bon_kl(p, r, n) == pytest.approx(bon_kl_estimate(eps, n), abs=2e-3)


def test_estimator_limits():
    n = 8
    assert bon_kl_estimate(1e-12, n) == pytest.approx(bon_kl_bound(n), abs=1e-9)  # n·ε ≪ 1: the bound
    assert bon_kl_estimate(1.0, n) == 0.0  # a single outcome
    values = bon_kl_estimate(np.array([1e-6, 0.01, 0.1, 0.5, 0.9]), n)
    assert np.all(values <= bon_kl_bound(n) + 1e-12) and np.all(values >= 0)
    with pytest.raises(ValueError):
        bon_kl_estimate(0.0, n)


def test_win_rate_reaches_n_over_n_plus_one_without_ties():
    p = np.full(2000, 1 / 2000)
    r = np.arange(2000, dtype=float)
    for n in (1, 3, 10):
        assert bon_win_rate(p, r, n) == pytest.approx(n / (n + 1), abs=2e-3)
        assert bon_win_rate(p, r, n) <= n / (n + 1) + 1e-12


def test_invalid_inputs():
    with pytest.raises(ValueError):
        bon_pmf([0.5, 0.6], [0, 1], 2)
    with pytest.raises(ValueError):
        bon_pmf([0.5, 0.5], [0, 1], 0)
    with pytest.raises(ValueError):
        bon_pmf([0.5, 0.5], [0, 1, 2], 2)


# ------------------------------------------------------------------ invariants (hypothesis)

instances = st.integers(1, 8).flatmap(
    lambda size: st.tuples(
        st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=size, max_size=size).filter(lambda w: sum(w) > 1e-3),
        st.lists(st.integers(0, 3), min_size=size, max_size=size),
    )
)


@settings(max_examples=150, deadline=None)
@given(instances, st.integers(1, 64))
def test_invariants(instance, n):
    weights, rewards = instance
    p = np.array(weights) / sum(weights)
    r = np.array(rewards, dtype=float)
    p_before, r_before = p.copy(), r.copy()
    pmf = bon_pmf(p, r, n)
    assert pmf.shape == p.shape and np.all(pmf >= 0)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(pmf[p == 0] == 0)
    kl = bon_kl(p, r, n)
    assert 0 <= kl <= bon_kl_bound(n) + 1e-12  # Theorem 2, also with ties
    win = bon_win_rate(p, r, n)
    assert 0.5 - 1e-12 <= win <= n / (n + 1) + 1e-12
    if n == 1:
        assert pmf == pytest.approx(p, abs=1e-12)
    assert np.array_equal(p, p_before) and np.array_equal(r, r_before)  # inputs untouched
