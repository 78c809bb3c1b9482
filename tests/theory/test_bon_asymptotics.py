"""Best-of-N at N = e^{mΔ} against the KL-Δ tilt over m-token i.i.d. sequences (Yang et al. 2024,
Theorem 2): the type reduction checked against sequences enumerated one by one, the log-space
best-of-n against `bon_pmf`, and the limit's approach on the theory figure's instance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from metagen.theory import alpha_for_kl, bon_against_tilt, bon_pmf, kl_divergence, tilt
from metagen.theory.bon_asymptotics import bon_over_outcomes, log_type_probability, sequence_types

P, R = np.array([0.5, 0.3, 0.2]), np.array([0.0, 0.5, 1.0])


def test_types_are_every_count_vector_once():
    for k, m in ((1, 4), (2, 3), (3, 5), (4, 6)):
        types = sequence_types(k, m)
        assert len(types) == math.comb(m + k - 1, k - 1)
        assert (types.sum(axis=1) == m).all() and (types >= 0).all()
        assert len({tuple(t) for t in types}) == len(types)
    assert np.exp(log_type_probability(sequence_types(3, 7), P)).sum() == pytest.approx(1.0)


def test_log_space_best_of_n_equals_bon_pmf_with_ties():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(15))
    r = rng.integers(0, 4, 15).astype(float)  # many ties
    for n in (1, 3, 50, 1000):
        assert bon_over_outcomes(np.log(p), r, n) == pytest.approx(bon_pmf(p, r, n), abs=1e-12)


def test_the_type_level_point_equals_sequences_enumerated_one_by_one():
    m, delta = 3, 0.4
    point = bon_against_tilt(P, R, delta, m)
    assert point.n == round(math.exp(m * delta)) == 3
    q = np.exp(R) / np.exp(R).sum()
    phi = tilt(P, q, alpha_for_kl(P, q, delta))
    assert kl_divergence(phi, P) == pytest.approx(delta, abs=1e-9)
    sequences = list(itertools.product(range(3), repeat=m))  # 27 sequences
    base = np.array([np.prod(P[list(s)]) for s in sequences])
    target = np.array([np.prod(phi[list(s)]) for s in sequences])
    rewards = np.array([R[list(s)].sum() for s in sequences])
    chosen = bon_pmf(base, rewards, point.n)
    assert point.kl_per_token == pytest.approx(kl_divergence(chosen, target) / m, abs=1e-12)
    assert point.bon_kl_per_token == pytest.approx(kl_divergence(chosen, base) / m, abs=1e-12)
    assert point.bon_reward == pytest.approx(chosen @ rewards / m, abs=1e-12)
    assert point.tilt_reward == pytest.approx(phi @ R, abs=1e-12)


def test_best_of_e_to_the_m_delta_approaches_the_tilt_as_m_grows():
    delta = 0.1
    points = [bon_against_tilt(P, R, delta, m) for m in (5, 20, 50, 100, 200, 400)]
    per_token = [point.kl_per_token for point in points]
    assert all(later < earlier for earlier, later in zip(per_token, per_token[1:]))
    assert per_token[-1] < 0.2 * per_token[0] and per_token[-1] < 0.005
    gaps = [point.tilt_reward - point.bon_reward for point in points]
    assert all(0 < later < earlier for earlier, later in zip(gaps, gaps[1:]))
    assert points[-1].bon_kl_per_token == pytest.approx(delta, rel=0.05)  # its KL budget spent, per token
    assert points[-1].n == round(math.exp(40))


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="delta=0 is out of range"):
        bon_against_tilt(P, R, 0, 5)
    with pytest.raises(ValueError, match="m=0 is out of range"):
        bon_against_tilt(P, R, 0.1, 0)
    with pytest.raises(ValueError, match="overflow"):
        bon_against_tilt(P, R, 10.0, 100)
    with pytest.raises(ValueError, match="every entry > 0"):
        bon_against_tilt([1.0, 0.0, 0.0], R, 0.1, 5)
    with pytest.raises(ValueError, match="types, more than"):
        sequence_types(6, 200)
