"""Epsilon truncation (Hewitt, Manning and Liang, 2022, "Truncation Sampling as Language Model
Desmoothing").

Keep every token whose probability is at least an absolute threshold, and always the argmax:

    keep(v) = p_v >= eps   or   v = argmax_u p_u

Unlike top-p, the threshold does not depend on the rest of the distribution.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import LOG_TOLERANCE, check_probability, float_logits, keep_argmax, keep_only, unchanged


def epsilon(logits: Tensor, eps: float) -> Tensor:
    """Remove tokens with probability below `eps`, keeping the most likely token(s).

    Args:
        logits: `(..., V)` scores.
        eps: absolute probability threshold in [0, 1); 0 keeps every token.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V) per row.
    """
    eps = check_probability("eps", eps, low=0.0, high=1.0, low_open=False, high_open=True)
    if eps == 0.0:
        return unchanged(logits)
    return keep_above(float_logits(logits), math.log(eps))


def keep_above(logits: Tensor, log_threshold: float | Tensor) -> Tensor:
    """The truncation epsilon and eta share: keep v where log p_v >= log_threshold, and the argmax.

    Args:
        logits: float32 `(..., V)` scores.
        log_threshold: a float, or `(..., 1)` per row (eta's entropy-dependent threshold).

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V) per row.
    """
    log_probs = torch.log_softmax(logits, dim=-1)  # (..., V)
    return keep_only(logits, keep_argmax(logits, log_probs >= log_threshold - LOG_TOLERANCE))
