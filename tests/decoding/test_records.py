"""`token_records`: the per-token numbers of N rows in one host transfer, the same numbers as
separate transfers would give."""

import math

import torch

from metagen.decoding.records import token_records


def test_one_host_transfer_per_step_unless_top_logprobs_are_asked(monkeypatch):
    """Regression: every step made three `.tolist()` transfers (chosen log-prob, certainty,
    sampled log-prob) even when no log-probabilities were asked for."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 30, generator=generator) * 3
    processed = logits / 0.7
    processed[:, :10] = -math.inf
    tokens = torch.tensor([12, 20, 29, 15])
    transfers = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: transfers.append(self.shape) or original(self))
    records = token_records(logits, tokens, processed)
    assert len(transfers) == 1
    monkeypatch.undo()
    raw = torch.log_softmax(logits, dim=-1)
    sampled = torch.log_softmax(processed, dim=-1)
    for b, record in enumerate(records):  # exactly the float32 values, as before
        assert record.logprob == raw[b, tokens[b]].item()
        assert record.sampled == sampled[b, tokens[b]].item()
        assert record.certainty == (-math.log(30) - raw.mean(dim=-1))[b].item()
        assert record.top is None
    greedy = token_records(logits, tokens)
    assert [r.sampled for r in greedy] == [0.0] * 4 and [r.logprob for r in greedy] == [r.logprob for r in records]
