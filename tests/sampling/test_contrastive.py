"""Contrastive decoding by hand: expert {0.5, 0.3, 0.15, 0.05}, amateur uniform, alpha 0.2.

Plausible: p_exp >= 0.2 * 0.5 = 0.1 -> tokens 0, 1, 2.
Scores: ln(0.5 / 0.25) = ln 2, ln(0.3 / 0.25) = ln 1.2, ln(0.15 / 0.25) = ln 0.6, token 3 -inf.
As a distribution: {2, 1.2, 0.6} / 3.8.
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import contrastive

from .helpers import assert_samples_match, logits_of

EXPERT = logits_of([0.5, 0.3, 0.15, 0.05])
AMATEUR = torch.zeros(4)


def test_scores_by_hand() -> None:
    out = contrastive(EXPERT, AMATEUR, alpha=0.2)
    assert out[:3].tolist() == pytest.approx([math.log(2), math.log(1.2), math.log(0.6)], abs=1e-6)
    assert out[3].item() == float("-inf")


def test_alpha_boundary_and_extremes() -> None:
    # alpha = 0.1: the threshold 0.05 equals the last token's probability, which stays.
    assert torch.isfinite(contrastive(EXPERT, AMATEUR, alpha=0.1)).all()
    assert torch.isfinite(contrastive(EXPERT, AMATEUR, alpha=1.0)).tolist() == [True, False, False, False]
    assert torch.isfinite(contrastive(EXPERT, AMATEUR, alpha=0.0)).all()


def test_amateur_temperature_by_hand() -> None:
    # Amateur {0.4, 0.3, 0.2, 0.1} at temperature 2 becomes sqrt(p) renormalised.
    amateur = logits_of([0.4, 0.3, 0.2, 0.1])
    roots = [math.sqrt(p) for p in (0.4, 0.3, 0.2, 0.1)]
    tempered = [r / sum(roots) for r in roots]
    expert = [0.5, 0.3, 0.15, 0.05]
    out = contrastive(EXPERT, amateur, alpha=0.2, amateur_temperature=2.0)
    expected = [math.log(expert[i] / tempered[i]) for i in range(3)]
    assert out[:3].tolist() == pytest.approx(expected, abs=1e-5)


def test_prefers_what_the_amateur_underrates() -> None:
    # Both models like token 0 most; the amateur likes it far more, so token 1 wins.
    expert = logits_of([0.6, 0.4])
    amateur = logits_of([0.9, 0.1])
    assert contrastive(expert, amateur, alpha=0.1).argmax().item() == 1


def test_amateur_zero_probability_stays_finite() -> None:
    amateur = torch.tensor([0.0, float("-inf"), 0.0, 0.0])
    out = contrastive(EXPERT, amateur, alpha=0.2)
    assert torch.isfinite(out[:3]).all() and out.argmax().item() == 1


def test_batched_and_validation() -> None:
    out = contrastive(EXPERT.expand(2, 3, 4), AMATEUR.expand(2, 3, 4), alpha=0.2)
    assert out.shape == (2, 3, 4)
    with pytest.raises(ValueError, match="same shape"):
        contrastive(EXPERT, torch.zeros(5))
    with pytest.raises(ValueError, match="alpha="):
        contrastive(EXPERT, AMATEUR, alpha=1.5)
    with pytest.raises(ValueError, match="amateur_temperature="):
        contrastive(EXPERT, AMATEUR, amateur_temperature=0.0)


def test_sampled_frequencies() -> None:
    out = contrastive(EXPERT, AMATEUR, alpha=0.2)
    assert_samples_match(out, [2 / 3.8, 1.2 / 3.8, 0.6 / 3.8, 0])
