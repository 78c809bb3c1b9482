"""Eta truncation (Hewitt, Manning and Liang, 2022, "Truncation Sampling as Language Model
Desmoothing").

An entropy-dependent version of epsilon truncation:

    H = -sum_v p_v log p_v                          (nats)
    threshold = min(eta, sqrt(eta) * exp(-H))
    keep(v) = p_v >= threshold   or   v = argmax_u p_u

A flat, high-entropy distribution gets a lower threshold (keeps more of its many plausible
tokens); a peaked one is cut at eta. The paper's recommended values are eta in [3e-4, 2e-3].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import check_probability, float_logits, unchanged
from .epsilon import keep_above


def entropy(logits: Tensor) -> Tensor:
    """Shannon entropy in nats of softmax(logits): `(..., V) -> (..., 1)`; `-inf` logits add 0.

    Time complexity: O(V) per row.
    """
    probs = torch.softmax(float_logits(logits), dim=-1)
    return torch.special.entr(probs).sum(dim=-1, keepdim=True)  # entr(0) = 0, no 0 * -inf


def eta(logits: Tensor, eta: float) -> Tensor:
    """Remove tokens with probability below `min(eta, sqrt(eta) * exp(-H))`, keeping the argmax.

    Args:
        logits: `(..., V)` scores.
        eta: hyper-parameter in [0, 1); 0 keeps every token.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V) per row.
    """
    eta = check_probability("eta", eta, low=0.0, high=1.0, low_open=False, high_open=True)
    if eta == 0.0:
        return unchanged(logits)
    logits = float_logits(logits)
    # log threshold = min(log eta, log sqrt(eta) - H), computed in log space.
    log_threshold = torch.clamp(0.5 * math.log(eta) - entropy(logits), max=math.log(eta))  # (..., 1)
    return keep_above(logits, log_threshold)
