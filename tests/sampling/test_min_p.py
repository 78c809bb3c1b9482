from __future__ import annotations

import pytest
import torch

from metagen.sampling import min_p

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    ("p", "kept"),
    [
        (0.5, [1, 2, 3]),  # threshold 0.5 * 0.4 = 0.2: the 0.2 token sits on it and is kept
        (0.6, [2, 3]),  # threshold 0.24
        (0.25, [0, 1, 2, 3]),  # threshold 0.1, on the boundary
        (0.26, [1, 2, 3]),
        (1.0, [3]),
    ],
)
def test_kept_set_by_hand(p: float, kept: list[int]) -> None:
    out = min_p(logits_of(PROBS), p)
    assert probs_of(out).tolist() == pytest.approx(renormalised(PROBS, kept), abs=1e-6)


def test_p_zero_keeps_all() -> None:
    logits = logits_of(PROBS)
    assert torch.equal(min_p(logits, 0.0), logits)


def test_threshold_scales_with_confidence() -> None:
    # Same p, peaked vs flat distribution: the flat one keeps more tokens.
    peaked = min_p(logits_of([0.9, 0.05, 0.03, 0.02]), 0.1)
    flat = min_p(logits_of([0.3, 0.25, 0.25, 0.2]), 0.1)
    assert int(torch.isfinite(peaked).sum()) == 1
    assert int(torch.isfinite(flat).sum()) == 4


def test_ties_at_top_are_kept() -> None:
    assert torch.isfinite(min_p(torch.tensor([2.0, 2.0, 0.0]), 1.0)).tolist() == [True, True, False]


@pytest.mark.parametrize("bad", [-0.1, 1.01, float("nan")])
def test_rejects_bad_p(bad: float) -> None:
    with pytest.raises(ValueError, match="p="):
        min_p(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    assert_samples_match(min_p(logits_of(PROBS), 0.5), renormalised(PROBS, [1, 2, 3]))
