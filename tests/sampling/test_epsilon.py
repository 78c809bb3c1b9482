from __future__ import annotations

import pytest
import torch

from metagen.sampling import epsilon

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    ("eps", "kept"),
    [
        (0.05, [0, 1, 2, 3]),
        (0.1, [0, 1, 2, 3]),  # on the boundary: kept
        (0.2, [1, 2, 3]),
        (0.25, [2, 3]),
        (0.5, [3]),  # nothing reaches 0.5: the argmax is kept anyway
        (0.99, [3]),
    ],
)
def test_kept_set_by_hand(eps: float, kept: list[int]) -> None:
    out = epsilon(logits_of(PROBS), eps)
    assert probs_of(out).tolist() == pytest.approx(renormalised(PROBS, kept), abs=1e-6)


def test_eps_zero_keeps_all() -> None:
    logits = logits_of(PROBS)
    assert torch.equal(epsilon(logits, 0.0), logits)


def test_threshold_is_absolute() -> None:
    # Adding many tiny tokens lowers every probability; epsilon does not adapt.
    logits = torch.cat([logits_of([0.5, 0.5]), torch.full((1000,), -20.0)])
    assert int(torch.isfinite(epsilon(logits, 1e-4)).sum()) == 2


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_rejects_bad_eps(bad: float) -> None:
    with pytest.raises(ValueError, match="eps="):
        epsilon(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    assert_samples_match(epsilon(logits_of(PROBS), 0.2), renormalised(PROBS, [1, 2, 3]))
