r"""Top-p (nucleus) truncation (Holtzman et al., 2020).

Keep the smallest set of tokens, taken in descending probability order, whose cumulative
probability reaches p:

$$
n^* = \min \{ n : p_{(1)} + \dots + p_{(n)} \ge p \}, \qquad \operatorname{keep}(v) = [\, p_v \ge p_{(n^*)} \,]
$$

where $p_{(1)} \ge p_{(2)} \ge \dots$ are the sorted probabilities. The most likely token is
always kept. Tie rule: tokens tied with the last kept probability p_(n*) are all kept (same as `top_k`), so the
result never depends on token order. Example: probabilities {0.1, 0.2, 0.3, 0.4} with p = 0.7 keep
{0.4, 0.3}, renormalised to {4/7, 3/7}.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metagen.models.kernels import fused_kernels

from ._common import MASS_TOLERANCE, check_probability, float_logits, keep_only, unchanged


def top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus truncation of each row at cumulative probability `p`.

    Args:
        logits: `(..., V)` scores.
        p: target mass in (0, 1]; `p = 1` keeps every token.

    Returns:
        New float32 logits `(..., V)`; removed tokens are `-inf`; the input is not modified.

    Time complexity: O(V) expected per row with metagen's compiled kernels (quickselect on
    values); otherwise O(V + K log K) when the nucleus lies in the top K = 256 (or 4096) tokens
    and O(V log V) (one full sort) for rows where it does not.
    """
    p = check_probability("p", p, low=0.0, high=1.0, low_open=True, high_open=False)
    if p == 1.0:
        return unchanged(logits)
    logits = float_logits(logits)
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    # The nucleus is usually a few dozen tokens: find the cutoff among the top 256, then the top
    # 4096 for rows those do not cover, and sort whole rows only as a last resort (a full sort of
    # 49k entries costs ~1.5 ms a row).
    flat = probs.reshape(-1, probs.shape[-1])  # (N, V)
    kernels = fused_kernels()
    if kernels is not None:  # quickselect on values, O(V) per row, same cutoff (tested)
        cutoff = kernels.top_p_cutoff(flat, p - MASS_TOLERANCE)
        return keep_only(logits, probs >= cutoff.reshape(*probs.shape[:-1], 1))
    cutoff = torch.empty(flat.shape[0], 1, dtype=flat.dtype)
    pending = torch.arange(flat.shape[0])
    for size in PARTIAL_SORT_SIZES + (flat.shape[-1],):
        rows = flat[pending]
        head = torch.topk(rows, min(size, rows.shape[-1]), dim=-1).values  # (n, K) descending
        row_cutoff, covered = _cutoff(head, p)
        done = covered.squeeze(-1) | (size >= flat.shape[-1])
        cutoff[pending[done]] = row_cutoff[done]
        pending = pending[~done]
        if pending.numel() == 0:
            break
    return keep_only(logits, probs >= cutoff.reshape(*probs.shape[:-1], 1))


PARTIAL_SORT_SIZES = (256, 4096)  # then the whole row


def _cutoff(sorted_probs: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """Smallest kept probability (..., 1) from the first K sorted probabilities, and whether
    those K already reach mass p (so the cutoff is exact) (..., 1)."""
    cumulative = sorted_probs.double().cumsum(dim=-1)
    mass_before = cumulative - sorted_probs.double()  # exclusive cumsum
    # The sorted token at position i belongs to the nucleus iff the mass before it is < p.
    nucleus_size = (mass_before < p - MASS_TOLERANCE).sum(dim=-1, keepdim=True).clamp(min=1)
    covered = cumulative[..., -1:] >= p - MASS_TOLERANCE
    return sorted_probs.gather(-1, nucleus_size - 1), covered
