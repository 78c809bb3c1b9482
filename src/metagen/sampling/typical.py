r"""Locally typical truncation (Meister, Pimentel, Wiher and Cotterell, 2022, "Locally Typical
Sampling").

Keep the tokens whose surprise $-\log p_v$ is closest to the expected surprise (the entropy H),
adding them in that order until their mass reaches `mass`:

$$
H = -\sum_v p_v \log p_v, \qquad d_v = \lvert -\log p_v - H \rvert
$$

order tokens by increasing $d_v$, then

$$
n^* = \min \{ n : p_{[1]} + \dots + p_{[n]} \ge \text{mass} \}, \qquad \operatorname{keep}(v) = [\, d_v \le d_{[n^*]} \,]
$$

Tie rule: tokens tied with the last kept distance are all kept (as in Hugging Face's
implementation), so the result does not depend on token order. Unlike the other truncations,
typical sampling may remove the argmax when the distribution has a long flat tail: the most likely
token can be "too surprising by being unsurprising". At least one token is always kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import MASS_TOLERANCE, check_probability, float_logits, keep_only, unchanged


def typical(logits: Tensor, mass: float) -> Tensor:
    """Locally typical truncation of each row to cumulative probability `mass`.

    Args:
        logits: `(..., V)` scores.
        mass: target mass in (0, 1]; 1 keeps every token.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V log V) per row (one sort).
    """
    mass = check_probability("mass", mass, low=0.0, high=1.0, low_open=True, high_open=False)
    if mass == 1.0:
        return unchanged(logits)
    logits = float_logits(logits)
    log_probs = torch.log_softmax(logits, dim=-1)  # (..., V)
    probs = log_probs.exp()
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)  # (..., 1), nats
    distance = (-log_probs - entropy).abs()  # (..., V); +inf for removed tokens
    sorted_distance, order = torch.sort(distance, dim=-1)
    sorted_probs = probs.gather(-1, order).double()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive cumsum
    kept_count = (mass_before < mass - MASS_TOLERANCE).sum(dim=-1, keepdim=True).clamp(min=1)
    cutoff = sorted_distance.gather(-1, kept_count - 1)  # (..., 1) largest kept distance
    return keep_only(logits, distance <= cutoff)
