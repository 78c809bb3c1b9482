from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import greedy, sample, token_logprobs

from .helpers import assert_frequencies, assert_samples_match, logits_of

INF = float("inf")


def test_sampled_frequencies_follow_softmax() -> None:
    assert_samples_match(logits_of([0.1, 0.2, 0.3, 0.4]), [0.1, 0.2, 0.3, 0.4])


def test_minus_inf_is_never_drawn() -> None:
    assert_samples_match(torch.tensor([0.0, -INF, 0.0, -INF]), [0.5, 0, 0.5, 0])


def test_single_finite_logit_always_drawn() -> None:
    logits = torch.full((500, 6), -INF)
    logits[:, 4] = -3.0
    assert (sample(logits, torch.Generator().manual_seed(0)) == 4).all()


def test_shapes() -> None:
    generator = torch.Generator().manual_seed(0)
    assert sample(torch.zeros(5), generator).shape == ()
    assert sample(torch.zeros(3, 5), generator).shape == (3,)
    assert sample(torch.zeros(2, 3, 5), generator).shape == (2, 3)
    assert greedy(torch.zeros(2, 3, 5)).shape == (2, 3)


def test_rows_are_sampled_from_their_own_distribution() -> None:
    logits = torch.stack([logits_of([0.7, 0.3, 0.0]), logits_of([0.0, 0.2, 0.8])])  # (2, 3)
    tokens = sample(logits.repeat(10_000, 1), torch.Generator().manual_seed(3)).reshape(-1, 2)
    assert_frequencies(tokens[:, 0], [0.7, 0.3, 0.0])
    assert_frequencies(tokens[:, 1], [0.0, 0.2, 0.8])


def test_generator_makes_draws_reproducible() -> None:
    logits = torch.randn(64, 50)
    first = sample(logits, torch.Generator().manual_seed(7))
    second = sample(logits, torch.Generator().manual_seed(7))
    other = sample(logits, torch.Generator().manual_seed(8))
    assert torch.equal(first, second) and not torch.equal(first, other)


@pytest.mark.parametrize("choose", [lambda x: sample(x, torch.Generator()), greedy])
@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ([-INF, -INF, -INF], "all -inf"),
        ([0.0, float("nan"), 1.0], "NaN"),
        ([0.0, INF, 1.0], r"\+inf"),
    ],
)
def test_garbage_raises(choose, row: list[float], reason: str) -> None:
    logits = torch.zeros(3, 3)
    logits[1] = torch.tensor(row)
    with pytest.raises(ValueError, match=rf"row \(1,\) .*{reason}"):
        choose(logits)


def test_greedy_picks_argmax_lowest_id_on_ties() -> None:
    assert greedy(torch.tensor([[0.0, 2.0, 2.0, -INF], [5.0, 1.0, 1.0, 1.0]])).tolist() == [1, 0]


def test_token_logprobs() -> None:
    logits = logits_of([0.1, 0.2, 0.3, 0.4]).expand(2, 4)
    result = token_logprobs(logits, torch.tensor([0, 3]), num_top=2)
    assert result.chosen.tolist() == pytest.approx([math.log(0.1), math.log(0.4)], abs=1e-6)
    assert result.top_ids.tolist() == [[3, 2], [3, 2]]
    assert result.top_values[0].tolist() == pytest.approx([math.log(0.4), math.log(0.3)], abs=1e-6)
    assert token_logprobs(logits, torch.tensor([0, 3])).top_ids.shape == (2, 0)
