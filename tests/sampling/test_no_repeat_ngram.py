from __future__ import annotations

import pytest
import torch

from metagen.sampling import NoRepeatNgramState, banned_tokens, no_repeat_ngram

from .helpers import assert_samples_match

V = 6


def banned(history: list[int], n: int) -> list[int]:
    out = no_repeat_ngram(torch.zeros(V), history, n)
    return [v for v in range(V) if out[v] == float("-inf")]


@pytest.mark.parametrize(
    ("history", "n", "expected"),
    [
        ([1, 2, 3, 1, 2], 3, [3]),  # "1 2" was followed by 3
        ([1, 2, 3, 1, 2], 2, [3]),  # "2" was followed by 3
        ([1, 2, 3, 1, 2], 1, [1, 2, 3]),  # n = 1 bans every seen token
        ([1, 2, 3, 1, 2], 4, []),  # "3 1 2" never occurred before
        ([1, 2, 1, 2, 1], 2, [2]),
        ([1, 2, 1, 4, 1], 2, [2, 4]),
        ([5, 5, 5], 2, [5]),
        ([1, 2], 3, []),  # history shorter than n
        ([], 2, []),
    ],
)
def test_banned_by_hand(history: list[int], n: int, expected: list[int]) -> None:
    assert banned(history, n) == expected


def test_padding_is_skipped_anywhere() -> None:
    assert banned([1, -1, 2, 3, 1], 2) == [2]  # read as [1, 2, 3, 1]
    assert banned([1, 2, 3, 1, 2, -1, -1], 3) == [3]  # right padding
    assert banned([-1, -1, 1, 2, 3, 1, 2], 3) == [3]  # left padding


def test_batched_rows() -> None:
    logits = torch.zeros(2, 3, V)  # (B, T, V)
    ids = torch.tensor([[1, 2, 3, 1], [4, 5, 4, -1]]).unsqueeze(1).expand(2, 3, 4)
    out = no_repeat_ngram(logits, ids, 2)
    assert torch.isinf(out[0]).nonzero()[:, 1].unique().tolist() == [2]
    assert torch.isinf(out[1]).nonzero()[:, 1].unique().tolist() == [5]


def test_banned_tokens_directly() -> None:
    history = torch.tensor([[-1, 1, 2, 1]])
    assert banned_tokens(history, 2, 4).tolist() == [[False, False, True, False]]


def test_rejects_bad_n() -> None:
    with pytest.raises(ValueError, match="n="):
        no_repeat_ngram(torch.zeros(V), [1], 0)


def test_state_matches_the_function_at_every_step() -> None:
    prompts = torch.tensor([[-1, 1, 2], [3, 4, 3]])
    state = NoRepeatNgramState.from_prompt(2, prompts, batch_size=2, max_new_tokens=1)
    generated = torch.tensor([[1, 2, 5, 1, 5, 1], [4, 0, 3, 4, 2, 0]])
    history = prompts
    for step in range(generated.shape[1]):  # overflows the reserved capacity on purpose
        logits = torch.randn(2, V)
        assert torch.equal(state.apply(logits), no_repeat_ngram(logits, history, 2))
        state.accept(generated[:, step])
        history = torch.cat([history, generated[:, step : step + 1]], dim=1)
    assert torch.equal(state.history[0, 1:], history[0, 1:])


def test_state_select_and_fork() -> None:
    state = NoRepeatNgramState.from_prompt(2, [[1, 2, 1], [3, 4, 3]], batch_size=2)
    forked = state.fork(torch.tensor([0]))
    state.select(torch.tensor([1, 1, 0]))
    logits = torch.zeros(3, V)
    assert torch.isinf(state.apply(logits)).nonzero().tolist() == [[0, 4], [1, 4], [2, 2]]
    forked.accept(torch.tensor([5]))
    assert forked.history.tolist() == [[1, 2, 1, 5]]
    assert state.history.shape == (3, 3)


def test_sampled_frequencies() -> None:
    # Uniform over 4 tokens, history "0 1 2 0": n = 2 bans 1, the rest stay uniform.
    out = no_repeat_ngram(torch.zeros(4), [0, 1, 2, 0], 2)
    assert_samples_match(out, [1 / 3, 0, 1 / 3, 1 / 3])
