"""Shared test helpers: toy distributions and a chi-square check of sampled frequencies."""

from __future__ import annotations

import math

import torch
from scipy.stats import chisquare

from metagen.sampling import sample

DRAWS = 20_000
MIN_P_VALUE = 1e-3


def logits_of(probs: list[float]) -> torch.Tensor:
    """float32 logits whose softmax is `probs` (log of the probabilities, -inf for zeros)."""
    return torch.tensor([math.log(p) if p > 0 else -math.inf for p in probs], dtype=torch.float32)


def probs_of(logits: torch.Tensor) -> torch.Tensor:
    """softmax in float64, for comparisons with hand-computed values."""
    return torch.softmax(logits.double(), dim=-1)


def renormalised(probs: list[float], keep: list[int]) -> list[float]:
    """`probs` restricted to the indices in `keep`, renormalised (0 elsewhere)."""
    total = sum(probs[i] for i in keep)
    return [probs[i] / total if i in keep else 0.0 for i in range(len(probs))]


def assert_frequencies(tokens: torch.Tensor, expected: list[float] | torch.Tensor) -> None:
    """Chi-square goodness of fit of sampled `tokens` against `expected` probabilities.

    Categories with expected probability 0 must never be drawn; the others must pass a
    chi-square test at p-value > 1e-3.
    """
    expected = torch.as_tensor(expected, dtype=torch.float64)
    counts = torch.bincount(tokens.reshape(-1), minlength=expected.numel()).double()
    support = expected > 0
    assert counts[~support].sum() == 0, f"drew tokens of probability 0: {counts.tolist()}"
    if int(support.sum()) == 1:
        return
    total = counts.sum()
    expected_counts = expected[support] / expected[support].sum() * total
    result = chisquare(counts[support].numpy(), expected_counts.numpy())
    assert result.pvalue > MIN_P_VALUE, (counts.tolist(), expected_counts.tolist(), result)


def assert_samples_match(adapted: torch.Tensor, expected: list[float], seed: int = 0) -> None:
    """Draw DRAWS tokens from the 1-D `adapted` logits and compare with `expected`."""
    generator = torch.Generator().manual_seed(seed)
    tokens = sample(adapted.expand(DRAWS, -1), generator)
    assert_frequencies(tokens, expected)
