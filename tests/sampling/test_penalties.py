"""Penalties on logits [2, -1, 0.5, 3] with history [0, 1, 1] (token 1 twice, token 0 once)."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import (
    frequency_penalty,
    frequency_penalty_from_counts,
    presence_penalty,
    presence_penalty_from_counts,
    repetition_penalty,
    repetition_penalty_from_mask,
    token_counts,
)

from .helpers import assert_samples_match

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0])
HISTORY = [0, 1, 1]


def test_repetition_by_hand() -> None:
    # Seen tokens 0 and 1: positive 2 -> 2 / 2 = 1, negative -1 -> -1 * 2 = -2; others unchanged.
    assert repetition_penalty(LOGITS, HISTORY, 2.0).tolist() == [1.0, -2.0, 0.5, 3.0]


def test_repetition_below_one_encourages() -> None:
    assert repetition_penalty(LOGITS, HISTORY, 0.5).tolist() == [4.0, -0.5, 0.5, 3.0]


def test_repetition_zero_logit_and_minus_inf() -> None:
    logits = torch.tensor([0.0, float("-inf"), 1.0])
    assert repetition_penalty(logits, [0, 1], 1.3).tolist() == [0.0, float("-inf"), 1.0]


def test_frequency_by_hand() -> None:
    # count = [1, 2, 0, 0]: logits - 0.5 * count.
    assert frequency_penalty(LOGITS, HISTORY, 0.5).tolist() == [1.5, -2.0, 0.5, 3.0]


def test_presence_by_hand() -> None:
    # presence = [1, 1, 0, 0]: logits - 0.5 * presence.
    assert presence_penalty(LOGITS, HISTORY, 0.5).tolist() == [1.5, -1.5, 0.5, 3.0]


def test_negative_penalties_encourage() -> None:
    assert frequency_penalty(LOGITS, HISTORY, -1.0).tolist() == [3.0, 1.0, 0.5, 3.0]
    assert presence_penalty(LOGITS, HISTORY, -1.0).tolist() == [3.0, 0.0, 0.5, 3.0]


def test_padding_is_ignored() -> None:
    padded = torch.tensor([-1, 0, -1, 1, 1, -1])
    assert torch.equal(frequency_penalty(LOGITS, padded, 0.5), frequency_penalty(LOGITS, HISTORY, 0.5))
    assert torch.equal(repetition_penalty(LOGITS, [-1, -1], 2.0), LOGITS)


def test_empty_history_is_identity() -> None:
    for penalty in (repetition_penalty, frequency_penalty, presence_penalty):
        assert torch.equal(penalty(LOGITS, [], 1.5), LOGITS)


def test_batched_histories() -> None:
    logits = torch.stack([LOGITS, LOGITS])  # (2, 4)
    ids = torch.tensor([[0, 1, 1], [3, -1, -1]])  # (2, 3)
    out = frequency_penalty(logits, ids, 0.5)
    assert out.tolist() == [[1.5, -2.0, 0.5, 3.0], [2.0, -1.0, 0.5, 2.5]]


def test_three_dimensional() -> None:
    logits = LOGITS.expand(2, 3, 4)  # (B, T, V)
    ids = torch.tensor([0, 1, 1]).expand(2, 3, 3)  # (B, T, L)
    out = repetition_penalty(logits, ids, 2.0)
    assert out.shape == (2, 3, 4)
    assert (out == torch.tensor([1.0, -2.0, 0.5, 3.0])).all()


def test_token_counts() -> None:
    counts = token_counts(torch.tensor([[0, 1, 1, -1], [2, 2, 2, 2]]), 3)
    assert counts.tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 4.0]]


def test_count_variants_match() -> None:
    counts = token_counts(torch.tensor(HISTORY), 4)
    assert torch.equal(repetition_penalty_from_mask(LOGITS, counts > 0, 2.0), repetition_penalty(LOGITS, HISTORY, 2.0))
    assert torch.equal(frequency_penalty_from_counts(LOGITS, counts, 0.3), frequency_penalty(LOGITS, HISTORY, 0.3))
    assert torch.equal(presence_penalty_from_counts(LOGITS, counts, 0.3), presence_penalty(LOGITS, HISTORY, 0.3))


def test_out_of_range_id_names_id_and_vocab() -> None:
    with pytest.raises(ValueError, match="token id 7 .* vocab size 4"):
        frequency_penalty(LOGITS, [0, 7], 0.5)


def test_shape_mismatch_and_list_for_batched_logits_raise() -> None:
    with pytest.raises(ValueError, match="do not match"):
        frequency_penalty(torch.zeros(2, 4), torch.zeros(3, 5, dtype=torch.long), 0.5)
    with pytest.raises(ValueError, match="1-D logits"):
        frequency_penalty(torch.zeros(2, 4), [0, 1], 0.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_repetition_rejects_bad_penalty(bad: float) -> None:
    with pytest.raises(ValueError, match="penalty="):
        repetition_penalty(LOGITS, HISTORY, bad)


@pytest.mark.parametrize("function", [frequency_penalty, presence_penalty])
def test_additive_penalties_reject_non_finite(function) -> None:
    with pytest.raises(ValueError, match="penalty="):
        function(LOGITS, HISTORY, float("nan"))


def test_sampled_frequencies() -> None:
    # Logits 0 everywhere; token 0 seen twice, token 1 once; frequency penalty ln 2:
    # weights {1/4, 1/2, 1, 1} / 2.75.
    logits = torch.zeros(4)
    out = frequency_penalty(logits, [0, 0, 1], math.log(2))
    assert_samples_match(out, [0.25 / 2.75, 0.5 / 2.75, 1 / 2.75, 1 / 2.75])
    # Repetition penalty 2 on logits ln [1, 4, 2, 1] with token 1 seen: 4 -> e^(ln 4 / 2) = 2.
    out = repetition_penalty(torch.log(torch.tensor([1.0, 4.0, 2.0, 1.0])), [1], 2.0)
    assert_samples_match(out, [1 / 6, 2 / 6, 2 / 6, 1 / 6], seed=1)
    # Presence penalty ln 2 on uniform logits with tokens 2, 2, 3 seen: {1, 1, 1/2, 1/2} / 3.
    out = presence_penalty(torch.zeros(4), [2, 2, 3], math.log(2))
    assert_samples_match(out, [1 / 3, 1 / 3, 1 / 6, 1 / 6], seed=2)
