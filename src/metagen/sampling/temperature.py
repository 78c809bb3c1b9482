"""Temperature scaling.

    p_t(v) = exp(z_v / t) / sum_u exp(z_u / t)

t < 1 sharpens the distribution towards its argmax, t > 1 flattens it towards uniform, and the
ranking of tokens never changes. t = 0 is greedy decoding; it is not a division and is handled by
`SamplerChain` (and `SamplingParams.greedy`) by taking the argmax instead.
"""

from __future__ import annotations

import math

from torch import Tensor

from ._common import float_logits


def temperature(logits: Tensor, t: float) -> Tensor:
    """Divide logits by the temperature `t > 0`.

    Args:
        logits: `(..., V)` scores; `-inf` entries stay `-inf`.
        t: temperature, finite and > 0.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V) per row.
    """
    t = float(t)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"t={t!r} is out of range: temperature must be in (0, inf); use greedy for 0")
    return float_logits(logits) / t
