"""KL(π ‖ p) from samples by log-likelihood ratios against the exact KL on enumerable toys: a
sequence model (two tokens and EOS, at most four tokens) steered token by token, and best-of-n."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from metagen.theory import (KLEstimate, bon_kl, bon_pmf, kl_divergence, kl_from_log_ratios, kl_from_step_divergences,
                            step_divergence)

EOS, LENGTH = 2, 4


def base_logits(prefix: tuple) -> np.ndarray:
    """The reference's next-token logits over (a, b, EOS) after `prefix`: EOS likelier as it grows."""
    return np.array([0.4 - 0.1 * prefix.count(0), 0.1 * len(prefix), -1.0 + 0.6 * len(prefix)])


def policy_logits(prefix: tuple) -> np.ndarray:
    """The steered policy: b pushed up after an a (a tokenwise tilt)."""
    return base_logits(prefix) + np.array([0.0, 1.2 if prefix[-1:] == (0,) else 0.3, -0.2])


def log_softmax(z: np.ndarray) -> np.ndarray:
    return z - np.logaddexp.reduce(z)


def sequences() -> list[tuple]:
    """Every sequence: tokens a/b then EOS, or LENGTH tokens a/b (cut at the limit)."""
    out = []
    for length in range(LENGTH + 1):
        for body in itertools.product((0, 1), repeat=length):
            out.append(body + (EOS,) if length < LENGTH else body)
    return out


def log_prob(logits, sequence: tuple) -> float:
    return sum(log_softmax(logits(sequence[:t]))[token] for t, token in enumerate(sequence))


def sample(rng, logits) -> tuple:
    prefix = ()
    while len(prefix) < LENGTH and (not prefix or prefix[-1] != EOS):
        probs = np.exp(log_softmax(logits(prefix)))
        prefix += (int(rng.choice(3, p=probs)),)
    return prefix


def test_both_estimators_are_within_four_standard_errors_of_the_exact_kl():
    support = sequences()
    policy = np.exp([log_prob(policy_logits, y) for y in support])
    reference = np.exp([log_prob(base_logits, y) for y in support])
    assert policy.sum() == pytest.approx(1.0) and reference.sum() == pytest.approx(1.0)
    exact = kl_divergence(policy, reference)
    rng = np.random.default_rng(7)
    drawn = [sample(rng, policy_logits) for _ in range(3000)]
    plain = kl_from_log_ratios([log_prob(policy_logits, y) for y in drawn], [log_prob(base_logits, y) for y in drawn])
    stepwise = kl_from_step_divergences([
        sum(step_divergence(policy_logits(y[:t]), base_logits(y[:t])) for t in range(len(y))) for y in drawn])
    for estimate in (plain, stepwise):
        assert estimate.samples == 3000
        assert abs(estimate.value - exact) < 4 * estimate.standard_error, (estimate, exact)
    assert stepwise.standard_error < plain.standard_error  # on this instance the token noise dominates
    low, high = plain.interval()
    assert high - low == pytest.approx(2 * 1.96 * plain.standard_error)


def test_the_log_ratio_estimate_of_best_of_n_meets_its_exact_kl():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(20))
    r = rng.normal(size=20)
    for n in (2, 8, 32):
        chosen = bon_pmf(p, r, n)
        drawn = rng.choice(20, size=4000, p=chosen)
        estimate = kl_from_log_ratios(np.log(chosen[drawn]), np.log(p[drawn]))
        assert abs(estimate.value - bon_kl(p, r, n)) < 4 * estimate.standard_error


def test_step_divergence_is_the_kl_of_the_two_softmaxes_row_by_row():
    a = np.array([[1.0, 0.0, -1.0], [0.0, -np.inf, 2.0]])
    b = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    expected = [kl_divergence(np.exp(log_softmax(x)), np.exp(log_softmax(y))) for x, y in zip(a, b)]
    assert step_divergence(a, b) == pytest.approx(expected, abs=1e-12)
    assert step_divergence(b[1], a[1]) == math.inf  # the policy gives mass where the reference has none


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="one shape"):
        kl_from_log_ratios([0.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="non-empty"):
        kl_from_step_divergences([])
    with pytest.raises(ValueError, match="must be finite"):
        kl_from_log_ratios([0.0], [-math.inf])
    assert math.isnan(kl_from_log_ratios([0.5], [0.0]).standard_error)
    assert KLEstimate(0.5, 0.1, 9).interval(2.0) == (pytest.approx(0.3), pytest.approx(0.7))
