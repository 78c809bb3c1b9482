"""Bradley–Terry, Elo and InfAlign's calibrated and transformed rewards."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

from metagen.theory import (
    best_of_n_transform,
    calibrate_reward,
    elo_expected,
    fit_bradley_terry,
    reward_cdf,
    worst_of_n_transform,
)


def test_elo_by_hand():
    assert elo_expected(1400, 1000) == pytest.approx(1 / (1 + 10**-1))
    assert elo_expected(1000, 1000) == 0.5
    assert elo_expected(1200, 1000) + elo_expected(1000, 1200) == pytest.approx(1.0)
    # Bradley–Terry on the scale 400 / ln 10
    assert elo_expected(1234, 1000) == pytest.approx(expit(234 * math.log(10) / 400))


def test_bradley_terry_moment_matching():
    # at the MLE every item's expected number of wins equals its observed number of wins
    comparisons = [(0, 1), (1, 2), (2, 0), (0, 2), (1, 0), (2, 1), (2, 1), (0, 3), (3, 2), (1, 3)]
    rewards = fit_bradley_terry(comparisons)
    assert rewards.sum() == pytest.approx(0.0, abs=1e-12)
    expected = np.zeros(4)
    observed = np.zeros(4)
    for loser, winner in comparisons:
        observed[winner] += 1
        expected[winner] += expit(rewards[winner] - rewards[loser])
        expected[loser] += expit(rewards[loser] - rewards[winner])
    assert expected == pytest.approx(observed, abs=1e-6)


def test_bradley_terry_two_items_closed_form():
    # 3 wins of item 1 out of 4: σ(r₁ − r₀) = 3/4, r₁ − r₀ = log 3
    rewards = fit_bradley_terry([(0, 1), (0, 1), (0, 1), (1, 0)])
    assert rewards[1] - rewards[0] == pytest.approx(math.log(3), abs=1e-6)


def test_bradley_terry_recovers_simulated_rewards():
    rng = np.random.default_rng(0)
    truth = np.array([-1.0, -0.2, 0.3, 1.1])
    truth -= truth.mean()
    first = rng.integers(0, 4, 8000)
    second = (first + rng.integers(1, 4, 8000)) % 4
    second_wins = rng.random(8000) < expit(truth[second] - truth[first])
    comparisons = np.where(second_wins[:, None], np.stack([first, second], 1), np.stack([second, first], 1))
    assert fit_bradley_terry(comparisons, 4) == pytest.approx(truth, abs=0.1)


def test_bradley_terry_without_mle():
    with pytest.raises(ValueError, match="strongly connected"):
        fit_bradley_terry([(0, 1), (1, 2)])  # item 2 never loses
    rewards = fit_bradley_terry([(0, 1), (1, 2)], prior_strength=1.0)
    assert rewards[0] < rewards[1] < rewards[2]
    with pytest.raises(ValueError):
        fit_bradley_terry([(0, 0)])


def test_calibration_by_hand():
    base = [0.0, 1.0, 1.0, 2.0]
    assert calibrate_reward([0.0, 1.0, 2.0, -5.0, 9.0], base) == pytest.approx([0.25, 0.75, 1.0, 0.0, 1.0])
    assert calibrate_reward([0.0, 1.0, 2.0], base, ties="half") == pytest.approx([0.125, 0.5, 0.875])
    with pytest.raises(ValueError):
        calibrate_reward([1.0], [])


def test_calibration_converges_to_the_reward_cdf():
    # on a finite outcome set the calibrated reward is F(y) = P_{z∼p}[r(z) ≤ r(y)]
    rng = np.random.default_rng(3)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    r = np.array([2.0, -1.0, 2.0, 0.5])
    base = r[rng.choice(4, size=50_000, p=p)]
    assert calibrate_reward(r, base) == pytest.approx(reward_cdf(p, r)[0], abs=0.01)


def test_calibrated_reward_of_base_samples_is_uniform():
    rng = np.random.default_rng(4)
    base = rng.normal(size=4000)
    fresh = rng.normal(size=4000)
    calibrated = calibrate_reward(fresh, base)
    assert np.histogram(calibrated, bins=4, range=(0, 1))[0] == pytest.approx(np.full(4, 1000), abs=120)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=30), st.lists(st.integers(-50, 50), min_size=1, max_size=10))
def test_calibration_ignores_increasing_maps(base, rewards):
    base, rewards = np.array(base, dtype=float), np.array(rewards, dtype=float)  # integers: ties happen

    def increasing(x):  # strictly increasing and exact in float64 on these integers
        return x**3 + 7 * x - 2

    calibrated = calibrate_reward(rewards, base)
    assert np.all((calibrated >= 0) & (calibrated <= 1))
    assert calibrate_reward(increasing(rewards), increasing(base)) == pytest.approx(calibrated)
    half = calibrate_reward(rewards, base, ties="half")
    assert np.all(half <= calibrated + 1e-12)


def test_transforms():
    u = np.linspace(0, 1, 11)
    assert best_of_n_transform(u, 2.0) == pytest.approx(np.exp(2 * u))
    assert worst_of_n_transform(u, 2.0) == pytest.approx(-np.exp(-2 * u))
    for values in (best_of_n_transform(u, 5.0), worst_of_n_transform(u, 5.0)):
        assert np.all(np.diff(values) > 0)  # both keep the order of the calibrated reward
    # best-of-N rewards gains at the top more, worst-of-N gains at the bottom more
    bon, won = best_of_n_transform(u, 5.0), worst_of_n_transform(u, 5.0)
    assert bon[-1] - bon[-2] > bon[1] - bon[0] and won[1] - won[0] > won[-1] - won[-2]
    with pytest.raises(ValueError):
        best_of_n_transform(u, 0.0)
