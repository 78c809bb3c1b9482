"""Entropy-adaptive decoding (Simonds 2025, "Entropy Adaptive Decoding: Dynamic Model Switching
for Efficient Inference"): a small model decodes while it is confident, a large one (same
tokenizer) where it is not.

At every step t the small model (the main model, run on every row at every step) gives its
next-token entropy in bits, before any temperature or truncation,

    H_t = −Σ_v p_t(v) · log2 p_t(v),        p_t = softmax(small logits at step t),

and its rolling mean over the last w steps, H̄_t = (1 / m) Σ_{i=t−m+1..t} H_i with m = min(t, w)
(the steps so far while fewer than w). Row b's token at step t comes from the large model's
logits when H̄_t > τ, else from the small model's: the row switches to the large model when its
rolling entropy rises above τ and back when it falls to τ or below. The rule is memoryless apart
from the window; the paper's stability condition on switching back is not applied here.

Both models' tokens feed the small model, so its entropy is always that of the full prefix. The
large model runs only at the steps some row needs it (`RowBatch` with `lazy_companions`): it
then catches up on the tokens it missed in one forward, so its logits are always those of the
full prefix. Rows decide on their own (some rows may take the large model's token while others
take the small one's); when any row needs the large model it runs on every live row, so its
cache rows stay in step (its forward is counted for all of them — a batch of one pays exactly
its own need). `GenerationResult.model_tokens` counts each model's tokens ("small", "large").

Cost per step: the small model's forward always, the large model's forward when a row needs it;
`decide` is O(B·V) (one softmax) plus O(B·w).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

SMALL, LARGE = "small", "large"


def entropy_bits(logits: Tensor) -> Tensor:
    """Entropy in bits of softmax(logits) per row: (B, V) → (B,) float32, 0 · log 0 = 0. O(B·V)."""
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.special.entr(probs).sum(dim=-1) / math.log(2.0)


@dataclass(frozen=True)
class EntropyAdaptiveConfig:
    """Entropy-adaptive decoding as a `combine.SwitchingCombiner`: the main model is the small one.

    large: the large model (same tokenizer) that decodes where the small one is uncertain.
    threshold: τ ≥ 0 in bits: a row takes the large model's token while the small model's rolling
        entropy is above it (0: the large model whenever the small one is not certain).
    window: w ≥ 1, the steps the rolling entropy averages over (the paper uses 5).
    """

    large: object
    threshold: float
    window: int = 5

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold < float("inf"):
            raise ValueError(f"threshold={self.threshold!r} is out of range: must be a finite number of bits >= 0")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window={self.window!r} is out of range: must be an int >= 1")

    @property
    def companions(self) -> tuple:
        return (self.large,)

    def start(self, rows: int) -> EntropyAdaptiveSwitch:
        return EntropyAdaptiveSwitch(self.threshold, self.window, rows)


class EntropyAdaptiveSwitch:
    """One request's rolling entropies and per-row choices (a `combine.ModelSwitch`).

    Attributes:
        recent: (B, w) the last w entropies of each row, newest last (the unfilled ones 0).
        steps: (B,) the steps each row has seen, capped at w.
        tokens: {"small": ..., "large": ...}, the tokens each model gave over all rows.
    """

    def __init__(self, threshold: float, window: int, rows: int) -> None:
        self.threshold, self.window = threshold, window
        self.recent = torch.zeros(rows, window)  # (B, w)
        self.steps = torch.zeros(rows, dtype=torch.long)  # (B,)
        self.tokens = {SMALL: 0, LARGE: 0}

    def rolling_entropy(self) -> Tensor:
        """H̄ per row: the mean of its last min(steps, w) entropies, (B,)."""
        filled = torch.arange(self.window) >= self.window - self.steps[:, None]  # (B, w)
        return (self.recent * filled).sum(dim=1) / self.steps.clamp(min=1)

    def decide(self, logits: Tensor) -> Tensor:
        """The small model's `logits` (B, V) at this step join each row's window; returns the rows
        (B,) bool whose token comes from the large model (H̄ > τ), and counts each model's tokens."""
        self.recent = torch.cat([self.recent[:, 1:], entropy_bits(logits)[:, None]], dim=1)
        self.steps = (self.steps + 1).clamp(max=self.window)
        use = self.rolling_entropy() > self.threshold  # (B,)
        large = int(use.sum())
        self.tokens[LARGE] += large
        self.tokens[SMALL] += len(use) - large
        return use

    def combine(self, logits: Sequence[Tensor | None], use: Tensor) -> Tensor:
        """Row b's scores are the large model's logits where `use[b]`, else the small model's:
        (B, V). `logits[1]` is None when no row used the large model this step."""
        small, large = logits
        if large is None:
            return small
        return torch.where(use[:, None], large.to(small.dtype), small)

    def select(self, indices: Sequence[int]) -> None:
        """Rows become `[rows[i] for i in indices]` (repeats fork)."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        self.recent, self.steps = self.recent[index], self.steps[index]
