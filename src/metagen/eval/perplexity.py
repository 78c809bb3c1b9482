"""Perplexity of a model on a text, by sliding windows (the standard evaluation of compressed
models: Frantar et al. 2023 on WikiText-2, Press et al. 2021's strided evaluation).

The token ids are cut into windows of at most `window` tokens starting every `stride` tokens.
Each window scores only the tokens the previous one did not (its last end − previous end),
each predicted from everything before it inside the window, so with stride < window every scored
token has at least window − stride tokens of context; stride = window is disjoint chunks. Token 0
has no context and is never scored. The result is token-weighted:

    PPL = exp( Σ_t −log p(x_t | x_{max(0, b(t)) .. t−1}) / #scored tokens )

Cost: ⌈n / stride⌉ forwards of ≤ window tokens, batched `batch_size` windows per forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Perplexity:
    """perplexity = exp(nll / tokens); nll: summed negative log-likelihood (nats)."""

    perplexity: float
    nll: float
    tokens: int
    windows: int
    window: int
    stride: int


def windows(length: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over `length` tokens."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window={window!r} is out of range: must be an int >= 2")
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= window:
        raise ValueError(f"stride={stride!r} is out of range: must be an int in [1, window={window}]")
    if length < 2:
        raise ValueError(f"the text has {length} token(s): perplexity needs at least 2")
    out, scored = [], 1
    for begin in range(0, length, stride):
        end = min(begin + window, length)
        if end > scored:
            out.append((begin, end, scored))
            scored = end
        if end == length:
            break
    return out


@torch.no_grad()
def perplexity(model, ids: Sequence[int], *, window: int = 512, stride: int = 256, batch_size: int | None = None,
               progress=None) -> Perplexity:
    """Token-weighted sliding-window perplexity of `model` (a LanguageModel) on `ids`.

    batch_size: windows per forward (default: as many as keep the (B, T, V) float32 logits
    under ~256 MB). `progress(done, total)` after each batch."""
    ids = list(ids)
    spans = windows(len(ids), window, stride)
    if window > model.max_context:
        raise ValueError(f"window={window} exceeds the model's context of {model.max_context} tokens")
    if batch_size is None:
        batch_size = max(1, (1 << 26) // (window * model.vocab_size))
    nll, count = 0.0, 0
    for start in range(0, len(spans), batch_size):
        group = spans[start:start + batch_size]
        rows = [ids[begin:end] for begin, end, _ in group]
        cache = model.new_cache(len(rows), capacity=sum(len(row) for row in rows))
        logits = model.forward(cache, rows, logits="all").logits  # (B, T, V) float32
        logprobs = torch.log_softmax(logits, dim=-1)
        for b, (begin, end, scored) in enumerate(group):
            targets = torch.tensor(ids[scored:end])  # predicted from positions scored − 1 .. end − 2
            positions = torch.arange(scored - begin - 1, end - begin - 1)
            nll -= float(logprobs[b, positions, targets].double().sum())
            count += len(targets)
        if progress is not None:
            progress(min(start + batch_size, len(spans)), len(spans))
    return Perplexity(math.exp(nll / count), nll, count, len(spans), window, stride)
