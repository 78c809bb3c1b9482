from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import bias_vector, logit_bias

from .helpers import assert_samples_match


def test_adds_bias_by_hand() -> None:
    out = logit_bias(torch.tensor([1.0, 2.0, 3.0, 4.0]), {0: 1.5, 3: -100.0})
    assert out.tolist() == [2.5, 2.0, 3.0, -96.0]


def test_batched() -> None:
    out = logit_bias(torch.zeros(2, 3, 4), {2: 1.0})
    assert out[..., 2].eq(1.0).all() and out[..., :2].eq(0.0).all()


def test_empty_bias_is_identity() -> None:
    logits = torch.randn(3, 5)
    assert torch.equal(logit_bias(logits, {}), logits)


@pytest.mark.parametrize("token_id", [4, 100, -1])
def test_out_of_range_id_names_id_and_vocab(token_id: int) -> None:
    with pytest.raises(ValueError, match=f"token id {token_id} is out of range for vocab size 4"):
        logit_bias(torch.zeros(4), {token_id: 1.0})


def test_non_finite_bias_raises() -> None:
    with pytest.raises(ValueError, match=r"logit_bias\[1\]"):
        bias_vector({1: float("nan")}, 4)


def test_sampled_frequencies() -> None:
    # +ln 3 on token 2 of a uniform 4-token distribution: {1, 1, 3, 1} / 6.
    out = logit_bias(torch.zeros(4), {2: math.log(3)})
    assert_samples_match(out, [1 / 6, 1 / 6, 3 / 6, 1 / 6])
