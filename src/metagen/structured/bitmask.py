"""Token bitmasks: which tokens a constraint allows, one bit per token, applied to logits.

A bitmask for B rows over a vocabulary of V tokens is an int32 tensor `(B, W)` with
W = ceil(V / 32): token v is allowed in row b iff bit `v % 32` of word `mask[b, v // 32]` is 1
(little-endian within a word, the layout llguidance fills). Applying it sets the logits of the
disallowed tokens to -inf:

    out[b, v] = logits[b, v]   if bit(mask[b], v) = 1 and v < 32 W
              = -inf           otherwise

`apply_token_bitmask` runs the fused C++ kernel (`models/kernels/fused.cpp`) when it is built and
the torch ops of `apply_token_bitmask_torch` otherwise; both give the same tensor (tested). Unlike
the truncation samplers (`sampling._common.keep_only`), a disallowed NaN or +inf becomes -inf too:
the constraint is a hard ban, and NaN / +inf are reported before the processors run.

Measured (benchmarks/structured_engines.py prints it; V = 49152, one thread): the kernel takes
about 7 us at B = 1 and 0.25-0.45 ms at B = 16; the torch ops 60-95 us and 1.4-3.1 ms, more than
llguidance needs to compute a typical mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metagen.models.kernels import fused_kernels

NEG_INF = float("-inf")
_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)  # (32,)


def words_for(vocab_size: int) -> int:
    """W = ceil(V / 32): int32 words per row of a bitmask over V tokens."""
    return (vocab_size + 31) // 32


def empty_bitmask(batch_size: int, vocab_size: int) -> Tensor:
    """An all-disallowed bitmask `(B, ceil(V / 32))` int32 (zeros)."""
    return torch.zeros(batch_size, words_for(vocab_size), dtype=torch.int32)


def bitmask_to_bool(mask: Tensor, vocab_size: int) -> Tensor:
    """The allowed set as a bool tensor `(B, V)` (tokens past 32 W are disallowed)."""
    bits = (mask.unsqueeze(-1) >> _BIT_SHIFTS) & 1  # (B, W, 32)
    allowed = bits.reshape(mask.shape[0], -1).bool()  # (B, 32 W)
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    padding = torch.zeros(mask.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool)
    return torch.cat([allowed, padding], dim=1)


def bool_to_bitmask(allowed: Tensor) -> Tensor:
    """The inverse of `bitmask_to_bool`: bool `(B, V)` -> int32 `(B, ceil(V / 32))`."""
    batch, vocab = allowed.shape
    padded = torch.zeros(batch, words_for(vocab) * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.to(torch.int64)
    words = (padded.reshape(batch, -1, 32) << _BIT_SHIFTS.to(torch.int64)).sum(-1)  # (B, W) in [0, 2^32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def apply_token_bitmask_torch(logits: Tensor, mask: Tensor) -> Tensor:
    """`apply_token_bitmask` with generic torch ops (the fallback and the kernel's reference)."""
    _check(logits, mask)
    return logits.float().masked_fill(~bitmask_to_bool(mask, logits.shape[1]), NEG_INF)


def apply_token_bitmask(logits: Tensor, mask: Tensor) -> Tensor:
    """New float32 logits `(B, V)`: the input where the mask `(B, W)` int32 allows, -inf elsewhere.

    The input is not modified. Time: O(B V), one pass (the compiled kernel copies or fills whole
    32-token words at once).
    """
    _check(logits, mask)
    kernels = fused_kernels()
    if kernels is None:
        return apply_token_bitmask_torch(logits, mask)
    return kernels.apply_token_bitmask(logits.float(), mask)


def _check(logits: Tensor, mask: Tensor) -> None:
    if logits.dim() != 2 or mask.dim() != 2 or mask.shape[0] != logits.shape[0]:
        raise ValueError(f"need logits (B, V) and mask (B, W) with the same B, got {tuple(logits.shape)} "
                         f"and {tuple(mask.shape)}")
    if mask.dtype != torch.int32:
        raise ValueError(f"the token bitmask must be int32, got {mask.dtype}")
