"""Logit bias (OpenAI API `logit_bias`): add a fixed offset to chosen tokens.

    z_v <- z_v + b_v        for v in the bias mapping

The API accepts b_v in [-100, 100] (checked by `SamplingParams`); -100 effectively bans a token
and +100 effectively forces it. The bias is applied to raw logits, before any penalty or
temperature, as in the OpenAI and vLLM servers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ._common import float_logits
from .processor import StatelessProcessor


def bias_vector(
    bias: Mapping[int, float], vocab_size: int, device: torch.device | str | None = None
) -> Tensor:
    """Dense `(V,)` float32 vector of the sparse bias mapping; zero for tokens not mentioned.

    Raises ValueError naming the token id and the vocab size for ids outside [0, V), and for
    non-finite bias values. Time complexity: O(V + len(bias)).
    """
    vector = torch.zeros(vocab_size, dtype=torch.float32)
    for token_id, value in bias.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise ValueError(f"logit_bias keys must be int token ids, got {token_id!r}")
        if not 0 <= token_id < vocab_size:
            raise ValueError(
                f"logit_bias token id {token_id} is out of range for vocab size {vocab_size}"
            )
        if not math.isfinite(float(value)):
            raise ValueError(f"logit_bias[{token_id}]={value!r} must be finite")
        vector[token_id] = float(value)
    return vector.to(device) if device is not None else vector


def logit_bias(logits: Tensor, bias: Mapping[int, float]) -> Tensor:
    """Add `bias[v]` to `logits[..., v]` for every token id `v` in the mapping.

    Args:
        logits: `(..., V)` scores.
        bias: token id -> additive bias.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(V) per row.
    """
    logits = float_logits(logits)
    return logits + bias_vector(bias, logits.shape[-1], logits.device)


class LogitBias(StatelessProcessor):
    """The bias as a stateless processor: `logits + b`, b a dense `(V,)` vector (`bias_vector`)."""

    def __init__(self, bias: Tensor) -> None:
        self.bias = bias
        super().__init__("logit_bias", self._add, argmax_invariant=False)

    def _add(self, logits: Tensor) -> Tensor:
        return float_logits(logits) + self.bias  # (B, V) + (V,)
