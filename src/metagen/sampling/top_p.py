"""Top-p (nucleus) truncation (Holtzman et al., 2020).

Keep the smallest set of tokens, taken in descending probability order, whose cumulative
probability reaches p:

    n* = min { n : p_(1) + ... + p_(n) >= p },     keep(v) = p_v >= p_(n*)

where p_(1) >= p_(2) >= ... are the sorted probabilities. The most likely token is always kept.
Tie rule: tokens tied with the last kept probability p_(n*) are all kept (same as `top_k`), so the
result never depends on token order. Example: probabilities {0.1, 0.2, 0.3, 0.4} with p = 0.7 keep
{0.4, 0.3}, renormalised to {4/7, 3/7}.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import MASS_TOLERANCE, check_probability, float_logits, keep_only, unchanged


def top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus truncation of each row at cumulative probability `p`.

    Args:
        logits: `(..., V)` scores.
        p: target mass in (0, 1]; `p = 1` keeps every token.

    Returns:
        New float32 logits `(..., V)`; removed tokens are `-inf`; the input is not modified.

    Time complexity: O(V log V) per row (one sort).
    """
    p = check_probability("p", p, low=0.0, high=1.0, low_open=True, high_open=False)
    if p == 1.0:
        return unchanged(logits)
    logits = float_logits(logits)
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    sorted_probs = torch.sort(probs, dim=-1, descending=True).values  # (..., V)
    mass_before = sorted_probs.double().cumsum(dim=-1) - sorted_probs.double()  # exclusive cumsum
    # The sorted token at position i belongs to the nucleus iff the mass before it is < p.
    nucleus_size = (mass_before < p - MASS_TOLERANCE).sum(dim=-1, keepdim=True).clamp(min=1)
    cutoff = sorted_probs.gather(-1, nucleus_size - 1)  # (..., 1) smallest kept probability
    return keep_only(logits, probs >= cutoff)
