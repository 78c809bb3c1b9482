"""Helpers shared by the sampling adapters (private to `metagen.sampling`).

Every adapter maps logits `(..., V)` to new float32 logits `(..., V)` and never writes into its
input. Removed tokens get `-inf`, so a later softmax renormalises over the kept set for free.
Adapters do not check for NaN / +inf (that is one host synchronisation, paid once per step by
`SamplerChain.process` and the token choice); they pass such entries on instead of removing them.
"""

from __future__ import annotations

import math

from torch import Tensor

NEG_INF = float("-inf")
POS_INF = float("inf")

# Cumulative masses (top-p, typical) are summed in float64 and the target mass `p` counts as
# reached at `p - MASS_TOLERANCE`, so a boundary hit exactly (0.4 + 0.3 = 0.7) is not lost to
# float32 rounding of the softmax.
MASS_TOLERANCE = 1e-6

# Log-probability thresholds (epsilon, eta, min-p, mirostat) keep a token when
# `log p >= log threshold - LOG_TOLERANCE`: a relative slack of 1e-5 on the probability, far
# below anything a user could tune, that makes "p equal to the threshold is kept" hold in float32.
LOG_TOLERANCE = 1e-5


def float_logits(logits: Tensor) -> Tensor:
    """`logits` as float32 (the same tensor when it already is); checks it is `(..., V)`."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
    return logits.float()


def unchanged(logits: Tensor) -> Tensor:
    """A float32 copy of `logits` that never aliases the input (for "keep everything" cases)."""
    converted = float_logits(logits)
    return converted.clone() if converted is logits else converted


def keep_only(logits: Tensor, keep: Tensor) -> Tensor:
    """New logits equal to `logits` where `keep` (bool, broadcastable) is True, `-inf` elsewhere.

    NaN and +inf entries are never removed: comparisons with them are False, so a truncation
    would otherwise turn a NaN into a "removed" -inf and hide it; kept, they reach the token
    choice, which refuses them by name (`check_choosable`).
    """
    return logits.masked_fill(~keep & (logits < POS_INF), NEG_INF)


def keep_argmax(logits: Tensor, keep: Tensor) -> Tensor:
    """`keep | (logits == row max)`: a truncation that always keeps its most likely token(s)."""
    return keep | (logits == logits.amax(dim=-1, keepdim=True))


def check_probability(name: str, value: float, *, low: float, high: float,
                      low_open: bool, high_open: bool) -> float:
    """Validate a scalar hyper-parameter against an interval; message names the argument."""
    value = float(value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if math.isnan(value) or too_low or too_high:
        interval = ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open else "]")
        raise ValueError(f"{name}={value!r} is out of range: must be in {interval}")
    return value
