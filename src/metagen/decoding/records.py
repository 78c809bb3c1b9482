"""`TokenRecord`s: what a row records with each chosen token (log-probability under the model and
under the sampled distribution, self-certainty, top log-probabilities; see `rows.Completion`),
computed for a batch of N tokens at once."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class TokenRecord(NamedTuple):
    """What a row records with each token (see `Completion`)."""

    logprob: float
    sampled: float
    certainty: float
    top: dict[int, float] | None


def token_records(logits: Tensor, tokens: Tensor, processed: Tensor | None = None,
                  num_top: int = 0) -> list[TokenRecord]:
    """Records of N chosen tokens, batched: one log-softmax over `logits (N, V)` (and one over
    `processed` when the tokens were sampled), one host transfer for the per-token numbers and
    one more only when top log-probabilities are asked for.

    logits: the model's raw logits; tokens: `(N,)` chosen ids; processed: `(N, V)` logits the
    tokens were drawn from (None: chosen by argmax, a point mass: sampled log-prob 0); num_top:
    how many top log-probabilities to report (0: none). O(N V).
    """
    ids = tokens.reshape(-1, 1).long()
    raw = torch.log_softmax(logits, dim=-1)  # (N, V)
    columns = [raw.gather(1, ids).squeeze(1), -math.log(logits.shape[-1]) - raw.mean(dim=-1)]  # (N,) each
    if processed is not None:
        columns.append(torch.log_softmax(processed, dim=-1).gather(1, ids).squeeze(1))
    # One transfer; widening to float64 is exact, so the numbers are those of separate transfers.
    values = torch.stack([column.double() for column in columns]).tolist()
    chosen, certainties = values[0], values[1]
    sampled = values[2] if processed is not None else [0.0] * len(chosen)
    tops: list[dict[int, float] | None] = [None] * len(chosen)
    if num_top:
        top = torch.topk(raw, num_top, dim=-1)
        tops = [dict(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
    return [TokenRecord(*fields) for fields in zip(chosen, sampled, certainties, tops)]
