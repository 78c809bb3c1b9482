"""PromptScorer: prompt log-probabilities from logits fed chunk by chunk equal one whole-prompt
`token_records` call, with hand-computed values on a toy case, and no tensor of the whole
prompt's size is ever computed or kept."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import prompt_scoring
from metagen.decoding.prompt_scoring import SCORE_ROWS, PromptScorer
from metagen.decoding.records import token_records


def test_hand_computed_records():
    # prompt [2, 0, 3]: record 1 scores token 0 under z_0, record 2 token 3 under z_1; z_2 predicts the next token
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    scorer = PromptScorer([2, 0, 3], num_top=1)
    scorer.add(logits[:1])
    assert scorer.records == []  # z_0 waits for the token it scores
    scorer.add(logits[1:])
    z = math.log(sum(math.exp(v) for v in (0.0, 1.0, 2.0, 3.0)))
    assert [r.logprob for r in scorer.records] == pytest.approx([0.0 - z, math.log(0.25)])
    assert scorer.records[0].top == pytest.approx({3: 3.0 - z}) and scorer.records[0].sampled == 0.0


@pytest.mark.parametrize("chunks", [[300], [1] * 7 + [293], [16] * 18 + [12], [150, 150]])
def test_chunks_give_the_whole_prompts_records(chunks):
    generator = torch.Generator().manual_seed(0)
    total, vocab = sum(chunks), 50
    ids = torch.randint(vocab, (total,), generator=generator).tolist()
    logits = torch.randn(total, vocab, generator=generator) * 3
    whole = token_records(logits[:-1], torch.tensor(ids[1:]), None, 4)
    scorer = PromptScorer(ids, num_top=4)
    start = 0
    for size in chunks:
        scorer.add(logits[start:start + size].clone())
        start += size
    assert len(scorer.records) == total - 1
    for mine, theirs in zip(scorer.records, whole):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-6)
        assert mine.certainty == pytest.approx(theirs.certainty, abs=1e-6)
        assert list(mine.top) == list(theirs.top)
        assert list(mine.top.values()) == pytest.approx(list(theirs.top.values()), abs=1e-6)


def test_no_whole_prompt_tensor_is_computed_or_kept(monkeypatch):
    """The log-softmax sees at most SCORE_ROWS positions at once, and between chunks the scorer
    holds one (V,) row that is a copy (a view would keep the caller's (C, V) chunk alive)."""
    seen = []
    monkeypatch.setattr(prompt_scoring, "token_records",
                        lambda rows, *args: seen.append(tuple(rows.shape)) or token_records(rows, *args))
    total, vocab = 5 * SCORE_ROWS + 3, 40
    scorer = PromptScorer([t % vocab for t in range(total)], num_top=2)
    chunk = torch.randn(3 * SCORE_ROWS, vocab)
    scorer.add(chunk)
    held = [value for value in vars(scorer).values() if isinstance(value, torch.Tensor) and value.dim() == 2]
    assert held == [] and scorer._last.shape == (vocab,) and scorer._last.untyped_storage().nbytes() == 4 * vocab
    scorer.add(torch.randn(total - 3 * SCORE_ROWS, vocab))
    assert len(scorer.records) == total - 1
    assert max(rows for rows, _ in seen) <= SCORE_ROWS


def test_chunks_past_the_prompt_are_refused():
    scorer = PromptScorer([1, 2, 3])
    scorer.add(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"logits must be \(C, V\) with 1 <= C <= 1"):
        scorer.add(torch.zeros(2, 4))
