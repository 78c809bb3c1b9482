"""Top-k truncation (Fan et al., 2018): keep the k most likely tokens.

    keep(v) = z_v >= z_(k)      where z_(k) is the k-th largest logit of the row

Tie rule: every token tied with the k-th largest value is kept, so a row may keep more than k
tokens when logits tie at the boundary. This is the rule of Hugging Face and vLLM; it makes the
result depend only on the values, never on token order (no arbitrary preference for low ids).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import float_logits, keep_only, unchanged


def top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the `k` largest logits of each row (plus ties with the k-th), set the rest to `-inf`.

    Args:
        logits: `(..., V)` scores.
        k: number of tokens to keep, an int >= 1; `k >= V` keeps every token.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V log k) per row (`torch.topk`).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is out of range: top_k must be an int >= 1")
    if k >= logits.shape[-1]:
        return unchanged(logits)
    logits = float_logits(logits)
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return keep_only(logits, logits >= kth_largest)
