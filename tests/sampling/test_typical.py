"""Locally typical sampling on {0.1, 0.2, 0.3, 0.4}, computed by hand.

H = -(0.1 ln 0.1 + 0.2 ln 0.2 + 0.3 ln 0.3 + 0.4 ln 0.4) = 1.27985 nats
-ln p = 2.30259, 1.60944, 1.20397, 0.91629
|-ln p - H| = 1.02274, 0.32959, 0.07588, 0.36356
typical order: 0.3 (0.076), 0.2 (0.330), 0.4 (0.364), 0.1 (1.023); cumulative 0.3, 0.5, 0.9, 1.0
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import typical

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]


def test_hand_computed_distances() -> None:
    entropy = -sum(p * math.log(p) for p in PROBS)
    distances = [abs(-math.log(p) - entropy) for p in PROBS]
    assert entropy == pytest.approx(1.27985, abs=1e-5)
    assert sorted(range(4), key=distances.__getitem__) == [2, 1, 3, 0]


@pytest.mark.parametrize(
    ("mass", "kept"),
    [
        (0.3, [2]),  # the most typical token alone reaches 0.3 (boundary)
        (0.2, [2]),
        (0.31, [1, 2]),
        (0.5, [1, 2]),  # 0.3 + 0.2 = 0.5 exactly: the argmax 0.4 is removed
        (0.51, [1, 2, 3]),
        (0.9, [1, 2, 3]),
        (0.91, [0, 1, 2, 3]),
    ],
)
def test_kept_set_by_hand(mass: float, kept: list[int]) -> None:
    out = typical(logits_of(PROBS), mass)
    assert probs_of(out).tolist() == pytest.approx(renormalised(PROBS, kept), abs=1e-6)


def test_mass_one_keeps_all() -> None:
    logits = logits_of(PROBS)
    assert torch.equal(typical(logits, 1.0), logits)


def test_uniform_keeps_all_ties() -> None:
    # Every token is exactly as surprising as the entropy: all tie, all are kept.
    assert torch.isfinite(typical(torch.zeros(5), 0.2)).all()


def test_one_finite_logit() -> None:
    logits = torch.tensor([float("-inf"), 1.0, float("-inf")])
    assert torch.equal(typical(logits, 0.5), logits)


@pytest.mark.parametrize("bad", [0.0, 1.2, float("nan")])
def test_rejects_bad_mass(bad: float) -> None:
    with pytest.raises(ValueError, match="mass="):
        typical(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    assert_samples_match(typical(logits_of(PROBS), 0.5), [0, 0.4, 0.6, 0])
