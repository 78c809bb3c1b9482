from __future__ import annotations

import pytest
import torch

from metagen.sampling import (
    PenaltyState,
    frequency_penalty,
    presence_penalty,
    repetition_penalty,
)


def test_from_prompt_marks_prompt_seen_and_counts_nothing() -> None:
    state = PenaltyState.from_prompt([0, 2, 2], batch_size=2, vocab_size=4)
    assert state.seen.tolist() == [[True, False, True, False]] * 2
    assert state.counts.tolist() == [[0.0] * 4] * 2
    assert state.batch_size == 2


def test_from_prompt_ragged_and_padded() -> None:
    ragged = PenaltyState.from_prompt([[1], [2, 3]], batch_size=2, vocab_size=4)
    padded = PenaltyState.from_prompt(torch.tensor([[1, -1], [2, 3]]), batch_size=2, vocab_size=4)
    assert torch.equal(ragged.seen, padded.seen)
    assert ragged.seen.tolist() == [[False, True, False, False], [False, False, True, True]]
    empty = PenaltyState.from_prompt(None, batch_size=3, vocab_size=4)
    assert not empty.seen.any()


def test_prompt_batch_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="batch_size=3"):
        PenaltyState.from_prompt(torch.zeros(2, 5, dtype=torch.long), batch_size=3, vocab_size=4)


def test_update_counts_and_skips_negative() -> None:
    state = PenaltyState.from_prompt(None, batch_size=3, vocab_size=4)
    state.accept(torch.tensor([1, 1, -1]))
    state.accept(torch.tensor([1, 3, -1]))
    assert state.counts.tolist() == [[0, 2, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]]
    assert state.seen.tolist() == [
        [False, True, False, False],
        [False, True, False, True],
        [False, False, False, False],  # -1 did not touch index 0
    ]


def test_apply_follows_the_convention() -> None:
    """Repetition over prompt + generated; frequency and presence over generated only."""
    prompt, generated = [0, 3], [1, 1, 2]
    state = PenaltyState.from_prompt(prompt, batch_size=1, vocab_size=5)
    for token in generated:
        state.accept(torch.tensor([token]))
    logits = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0]])
    expected = repetition_penalty(logits[0], prompt + generated, 1.5)
    expected = frequency_penalty(expected, generated, 0.25)
    expected = presence_penalty(expected, generated, 0.75)
    out = state.apply(logits, repetition_penalty=1.5, frequency_penalty=0.25, presence_penalty=0.75)
    assert torch.allclose(out[0], expected)
    # By hand: 1/1.5, -2*1.5 - 0.5 - 0.75, 0.5/1.5 - 0.25 - 0.75, 3/1.5, 0.
    assert out[0].tolist() == pytest.approx([1 / 1.5, -4.25, 0.5 / 1.5 - 1.0, 2.0, 0.0])


def test_apply_neutral_is_a_copy() -> None:
    state = PenaltyState.from_prompt([0], batch_size=1, vocab_size=3)
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    out = state.apply(logits)
    assert torch.equal(out, logits) and out.data_ptr() != logits.data_ptr()


def test_select_reorders_and_duplicates() -> None:
    state = PenaltyState.from_prompt([[0], [1], [2]], batch_size=3, vocab_size=4)
    state.accept(torch.tensor([3, 3, 1]))
    state.select(torch.tensor([2, 2, 0]))
    assert state.batch_size == 3
    assert state.seen.tolist() == [[False, True, True, False]] * 2 + [[True, False, False, True]]
    assert state.counts.tolist() == [[0, 1, 0, 0]] * 2 + [[0, 0, 0, 1]]
    # Duplicated rows are independent copies.
    state.accept(torch.tensor([0, 2, 2]))
    assert state.counts[0].tolist() == [1, 1, 0, 0] and state.counts[1].tolist() == [0, 1, 1, 0]


def test_fork_leaves_the_original_alone() -> None:
    state = PenaltyState.from_prompt([0], batch_size=2, vocab_size=3)
    forked = state.fork(torch.tensor([1]))
    forked.accept(torch.tensor([2]))
    assert forked.counts.tolist() == [[0, 0, 1]]
    assert state.counts.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert not state.seen[:, 2].any()
