"""`RowBatch`: a request's set-up, and `keep` moving the cache, the chain, the followers and the
completion index of every live row together (toy model: its cache holds each row's tokens)."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.records import TokenRecord
from metagen.sampling import SamplingParams
from tests.decoding.toy_model import EOS, A, B, BOS, C, VOCAB, ToyModel


class Follower:
    def __init__(self) -> None:
        self.selected: list[list[int]] = []

    def select(self, indices) -> None:
        self.selected.append(list(indices))


def _started(n: int = 3) -> RowBatch:
    params = SamplingParams(temperature=1.0, seed=0, n=n, max_tokens=8, repetition_penalty=2.0)
    batch = RowBatch.start(ToyModel(), [BOS, A], params)
    batch.prefill()
    return batch


def test_start_sets_up_one_row_per_completion_and_prefill_forks_the_prompt():
    batch = _started()
    assert batch.active == [0, 1, 2] and len(batch.rows) == 3
    assert batch.cache.rows == [[BOS, A]] * 3
    assert batch.completions == [row.completion for row in batch.rows]
    assert batch.generator is not None and batch.rules.max_new_tokens == 8


def test_keep_moves_cache_chain_followers_and_active_together():
    batch, follower = _started(), Follower()
    batch.followers.append(follower)
    tokens = torch.tensor([A, B, C])
    batch.chain.accept(tokens)  # each row's penalty now falls on its own token
    for b, row in enumerate(batch.cache.rows):
        row.append(int(tokens[b]))
    batch.keep([0, 2])
    assert batch.active == [0, 2]
    assert batch.cache.rows == [[BOS, A, A], [BOS, A, C]]
    assert follower.selected == [[0, 2]]
    processed = batch.chain.process(torch.ones(2, VOCAB))  # repetition penalty 2: 1 -> 0.5 on seen tokens
    penalized = (processed < 1).nonzero().tolist()
    # the prompt's tokens in both rows; row 1 is old row 2: its "c", not old row 1's "b"
    assert sorted(penalized) == sorted([[0, BOS], [0, A], [1, BOS], [1, A], [1, C]])
    assert batch.row(1) is batch.rows[2]


def test_keep_of_every_row_is_a_no_op():
    batch, follower = _started(), Follower()
    batch.followers.append(follower)
    batch.keep([0, 1, 2])
    assert follower.selected == [] and batch.active == [0, 1, 2] and batch.cache.batch_size == 3


def test_live_lists_the_rows_that_have_not_finished():
    batch = _started(2)
    batch.push(0, EOS, TokenRecord(0.0, 0.0, 0.0, None))  # completion 0 ends on EOS
    assert batch.rows[0].finished and batch.live() == [1]


def test_start_refuses_a_prompt_that_leaves_no_room():
    with pytest.raises(ValueError, match="no room to generate"):
        RowBatch.start(ToyModel(max_context=2), [BOS, A], SamplingParams())
