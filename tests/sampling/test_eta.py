"""Eta sampling thresholds computed by hand.

{0.1, 0.2, 0.3, 0.4}: H = 1.27985 nats, exp(-H) = 0.27808
    eta = 0.15: min(0.15, sqrt(0.15) * 0.27808 = 0.10770) = 0.10770 -> drops 0.1
    eta = 0.09: min(0.09, 0.3 * 0.27808 = 0.08342) = 0.08342 -> keeps all
    eta = 0.6:  min(0.6, 0.77460 * 0.27808 = 0.21540) = 0.21540 -> keeps {0.3, 0.4}
{0.97, 0.01, 0.01, 0.01}: H = 0.16770, exp(-H) = 0.84561
    eta = 0.02:  min(0.02, 0.14142 * 0.84561) = 0.02 -> keeps only 0.97 (eta is the binding term)
    eta = 0.005: min(0.005, ...) = 0.005 -> keeps all
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import entropy, eta

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]
PEAKED = [0.97, 0.01, 0.01, 0.01]


def threshold(probs: list[float], eta_value: float) -> float:
    h = -sum(p * math.log(p) for p in probs)
    return min(eta_value, math.sqrt(eta_value) * math.exp(-h))


def test_hand_computed_thresholds() -> None:
    assert threshold(PROBS, 0.15) == pytest.approx(0.10770, abs=1e-5)
    assert threshold(PROBS, 0.09) == pytest.approx(0.08342, abs=1e-5)
    assert threshold(PROBS, 0.6) == pytest.approx(0.21540, abs=1e-5)
    assert threshold(PEAKED, 0.02) == 0.02


def test_entropy() -> None:
    assert entropy(logits_of(PROBS)).item() == pytest.approx(1.27985, abs=1e-5)
    assert entropy(torch.tensor([0.0, float("-inf")])).item() == 0.0


@pytest.mark.parametrize(
    ("probs", "eta_value", "kept"),
    [
        (PROBS, 0.15, [1, 2, 3]),
        (PROBS, 0.09, [0, 1, 2, 3]),
        (PROBS, 0.6, [2, 3]),
        (PEAKED, 0.02, [0]),
        (PEAKED, 0.005, [0, 1, 2, 3]),
        (PEAKED, 0.99, [0]),
    ],
)
def test_kept_set_by_hand(probs: list[float], eta_value: float, kept: list[int]) -> None:
    out = eta(logits_of(probs), eta_value)
    assert probs_of(out).tolist() == pytest.approx(renormalised(probs, kept), abs=1e-6)


def test_eta_zero_keeps_all() -> None:
    logits = logits_of(PROBS)
    assert torch.equal(eta(logits, 0.0), logits)


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_rejects_bad_eta(bad: float) -> None:
    with pytest.raises(ValueError, match="eta="):
        eta(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    assert_samples_match(eta(logits_of(PROBS), 0.15), renormalised(PROBS, [1, 2, 3]))
