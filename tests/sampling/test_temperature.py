from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import temperature

from .helpers import assert_samples_match, probs_of


def test_divides_logits() -> None:
    out = temperature(torch.tensor([1.0, 2.0, 3.0, float("-inf")]), 2.0)
    assert out.tolist() == [0.5, 1.0, 1.5, float("-inf")]


def test_probabilities_by_hand() -> None:
    # probs {0.2, 0.8} at t = 0.5 become {0.04, 0.64} / 0.68 (p^(1/t) renormalised).
    logits = torch.tensor([math.log(0.2), math.log(0.8)])
    expected = [0.04 / 0.68, 0.64 / 0.68]
    assert probs_of(temperature(logits, 0.5)).tolist() == pytest.approx(expected, abs=1e-6)


def test_t_one_is_identity_and_ranking_kept() -> None:
    logits = torch.tensor([0.3, -1.0, 2.5, 0.0])
    assert torch.equal(temperature(logits, 1.0), logits)
    for t in (0.1, 3.0, 50.0):
        assert torch.equal(temperature(logits, t).argsort(), logits.argsort())


def test_high_temperature_flattens() -> None:
    logits = torch.tensor([0.0, 1.0, 5.0])
    assert probs_of(temperature(logits, 1e4)).tolist() == pytest.approx([1 / 3] * 3, abs=1e-3)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_rejects_non_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="t="):
        temperature(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    logits = torch.tensor([math.log(0.1), math.log(0.2), math.log(0.3), math.log(0.4)])
    # t = 0.5 squares probabilities: {0.01, 0.04, 0.09, 0.16} / 0.30.
    assert_samples_match(temperature(logits, 0.5), [0.01 / 0.3, 0.04 / 0.3, 0.09 / 0.3, 0.16 / 0.3])
