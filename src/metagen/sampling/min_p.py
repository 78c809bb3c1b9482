"""Min-p truncation (Nguyen et al., 2024, "Turning Up the Heat: Min-p Sampling").

Keep the tokens whose probability is at least a fraction p of the top token's:

    keep(v) = p_v >= p * max_u p_u   <=>   z_v - max_u z_u >= log p

computed on logits directly (no softmax needed). The threshold scales with the model's
confidence: a peaked distribution keeps few tokens, a flat one many. Because it compares ratios
with the top token, min-p applied after a truncation that keeps the argmax (top-k, top-p) removes
exactly the tokens it would remove from the full distribution.
"""

from __future__ import annotations

import math

from torch import Tensor

from ._common import LOG_TOLERANCE, check_probability, float_logits, keep_only, unchanged


def min_p(logits: Tensor, p: float) -> Tensor:
    """Remove tokens with probability below `p` times the row's largest probability.

    Args:
        logits: `(..., V)` scores.
        p: relative threshold in [0, 1]; 0 keeps every token, 1 keeps only the argmax (and ties).

    Returns:
        New float32 logits `(..., V)`; the argmax is always kept; the input is not modified.

    Time complexity: O(V) per row.
    """
    p = check_probability("p", p, low=0.0, high=1.0, low_open=False, high_open=False)
    if p == 0.0:
        return unchanged(logits)
    logits = float_logits(logits)
    gap = logits - logits.amax(dim=-1, keepdim=True)  # (..., V) = log(p_v / p_max)
    return keep_only(logits, gap >= math.log(p) - LOG_TOLERANCE)
