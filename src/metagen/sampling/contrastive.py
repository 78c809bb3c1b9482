"""Contrastive decoding (Li et al., 2023, "Contrastive Decoding: Open-ended Text Generation as
Optimization"), and its beta-weighted form (O'Brien & Lewis, 2023, "Contrastive Decoding Improves
Reasoning in Large Language Models").

Score tokens by how much more the large "expert" model likes them than a small "amateur" model,
restricted to tokens the expert itself finds plausible:

    V_head = { v : p_exp(v) >= alpha * max_u p_exp(u) }
    score(v) = log p_exp(v) - log p_ama(v)     if v in V_head
             = -inf                             otherwise

The plausibility constraint keeps the ratio from rewarding tokens both models find implausible
(where the amateur is even more wrong). The paper searches this score with beam search or takes
its argmax; it can also be sampled as logits. An optional amateur temperature (the paper's tau)
is applied to the amateur logits before its softmax.

O'Brien & Lewis weight the two models' logits s (not log-probabilities) by beta >= 0, on the same
plausible set (their mask, s_exp(v) >= log alpha + max_u s_exp(u), is the one above):

    score(v) = (1 + beta) * s_exp(v) - beta * s_ama(v)     if v in V_head
             = -inf                                        otherwise

beta = 0 is the expert alone (its logits, masked); a larger beta contrasts harder. Within a row a
logit differs from its log-probability by a constant, so as logits (softmax, argmax) the score is
log p_exp + beta * (log p_exp - log p_ama): Li et al.'s difference is the beta -> inf direction,
with the expert's own distribution mixed back in. The amateur temperature divides s_ama here too
(tau = 1 is the paper's form).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import LOG_TOLERANCE, check_probability, float_logits, keep_only

_LOWEST = torch.finfo(torch.float32).min
_HIGHEST = torch.finfo(torch.float32).max


def contrastive(
    expert_logits: Tensor,
    amateur_logits: Tensor,
    alpha: float = 0.1,
    amateur_temperature: float = 1.0,
    beta: float | None = None,
) -> Tensor:
    """Contrastive scores on the alpha-plausible set, `-inf` elsewhere: `log p_exp - log p_ama`
    (Li et al. 2023) when `beta` is None, else `(1 + beta) * s_exp - beta * s_ama / tau` on the
    logits s (O'Brien & Lewis 2023).

    Args:
        expert_logits: `(..., V)` scores of the expert model.
        amateur_logits: `(..., V)` scores of the amateur model (same shape).
        alpha: plausibility threshold in [0, 1], relative to the expert's top probability.
        amateur_temperature: temperature tau > 0 dividing the amateur's logits (before its softmax).
        beta: None for Li et al.'s log-probability difference, or O'Brien & Lewis's weight, a
            finite number >= 0 (0: the expert's logits, masked).

    Returns:
        New float32 scores `(..., V)`, usable as logits. A plausible token to which the amateur
        gives probability 0 gets the largest finite float32 score rather than +inf. The inputs
        are not modified.

    Time complexity: O(V) per row.
    """
    alpha = check_probability("alpha", alpha, low=0.0, high=1.0, low_open=False, high_open=False)
    amateur_temperature = float(amateur_temperature)
    if not (amateur_temperature > 0 and math.isfinite(amateur_temperature)):
        raise ValueError(
            f"amateur_temperature={amateur_temperature!r} is out of range: must be in (0, inf)"
        )
    if beta is not None:
        beta = float(beta)
        if not (0.0 <= beta < math.inf):
            raise ValueError(f"beta={beta!r} is out of range: must be None or a finite number >= 0")
    expert_logits = float_logits(expert_logits)
    amateur_logits = float_logits(amateur_logits)
    if expert_logits.shape != amateur_logits.shape:
        raise ValueError(
            f"expert logits {tuple(expert_logits.shape)} and amateur logits "
            f"{tuple(amateur_logits.shape)} must have the same shape (..., V)"
        )
    expert_log_probs = torch.log_softmax(expert_logits, dim=-1)  # (..., V)
    if beta is None:
        amateur_log_probs = torch.log_softmax(amateur_logits / amateur_temperature, dim=-1)
        # Keep the score finite where the amateur says "impossible": log 0 -> most negative float.
        amateur_log_probs = amateur_log_probs.clamp(min=_LOWEST)
        scores = (expert_log_probs - amateur_log_probs).clamp(max=_HIGHEST)
    else:
        # (1 + beta) s_exp - beta s_ama written s_exp + beta (s_exp - s_ama): beta = 0 returns s_exp
        # exactly. The difference is clamped finite first, so 0 * (+-inf) never makes a NaN.
        difference = (expert_logits - amateur_logits / amateur_temperature).clamp(min=_LOWEST, max=_HIGHEST)
        scores = (expert_logits + beta * difference).clamp(max=_HIGHEST)
    gap = expert_log_probs - expert_log_probs.amax(dim=-1, keepdim=True)  # log(p / p_max)
    plausible = gap >= (math.log(alpha) if alpha > 0 else -math.inf) - LOG_TOLERANCE
    plausible &= expert_log_probs > -math.inf
    return keep_only(scores, plausible)
