from __future__ import annotations

import pytest
import torch

from metagen.sampling import top_k

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]


def test_keeps_k_largest() -> None:
    out = top_k(logits_of(PROBS), 2)
    assert probs_of(out).tolist() == pytest.approx([0, 0, 3 / 7, 4 / 7], abs=1e-6)
    assert torch.isinf(out[:2]).all()


@pytest.mark.parametrize("k", [4, 5, 1000])
def test_k_at_least_vocab_keeps_all(k: int) -> None:
    logits = logits_of(PROBS)
    assert torch.equal(top_k(logits, k), logits)


def test_k_one_keeps_argmax() -> None:
    assert probs_of(top_k(logits_of(PROBS), 1)).tolist() == [0, 0, 0, 1]


def test_ties_at_the_kth_value_are_all_kept() -> None:
    # k = 2 over [1, 3, 2, 2, 0]: the k-th value is 2, tied twice, so three tokens are kept.
    out = top_k(torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0]), 2)
    assert torch.isfinite(out).tolist() == [False, True, True, True, False]
    # The rule does not depend on token order.
    out_reversed = top_k(torch.tensor([0.0, 2.0, 2.0, 3.0, 1.0]), 2)
    assert torch.isfinite(out_reversed).tolist() == [False, True, True, True, False]


def test_fewer_finite_than_k() -> None:
    logits = torch.tensor([float("-inf"), 1.0, float("-inf"), float("-inf")])
    out = top_k(logits, 2)
    assert torch.equal(out, logits)


def test_batched_rows_use_their_own_kth_value() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    assert torch.isfinite(top_k(logits, 2)).tolist() == [[False, True, True], [True, True, False]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_rejects_bad_k(bad: object) -> None:
    with pytest.raises(ValueError, match="k="):
        top_k(torch.zeros(3), bad)  # type: ignore[arg-type]


def test_sampled_frequencies() -> None:
    probs = [0.05, 0.1, 0.15, 0.2, 0.25, 0.25]
    assert_samples_match(top_k(logits_of(probs), 3), renormalised(probs, [3, 4, 5]))
