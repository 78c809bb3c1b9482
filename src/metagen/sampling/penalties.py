"""Repetition, frequency and presence penalties.

Three ways to discourage tokens that already occurred (c_v = how often token v occurred):

    repetition (Keskar et al., 2019, CTRL):  z_v <- z_v / r  if z_v > 0,  z_v * r  otherwise,
                                             for every v with c_v > 0          (r > 1 penalises)
    frequency (OpenAI API):                  z_v <- z_v - alpha_f * c_v
    presence  (OpenAI API):                  z_v <- z_v - alpha_p * 1[c_v > 0]

Which tokens count (the convention of vLLM, followed by `SamplerChain` and `PenaltyState`): the
repetition penalty looks at prompt + generated tokens; frequency and presence penalties look at
generated tokens only. The functions taking `token_ids` penalise exactly the ids they are given,
so the caller chooses the history.

Each penalty comes in two forms: from a token history `token_ids (..., T)` (negative entries are
padding; a list of ints is accepted for 1-D logits), which builds counts in O(T + V); and from
precomputed statistics (`*_from_counts`, `*_from_mask`), O(V), which the decoding loop uses
through `PenaltyState` so that no step rebuilds counts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import float_logits
from ._tokens import TokenIds, history_for, token_counts


def _check_repetition(penalty: float) -> float:
    penalty = float(penalty)
    if not (penalty > 0 and math.isfinite(penalty)):
        raise ValueError(f"penalty={penalty!r} is out of range: repetition penalty must be in (0, inf)")
    return penalty


def _check_finite(name: str, penalty: float) -> float:
    penalty = float(penalty)
    if not math.isfinite(penalty):
        raise ValueError(f"penalty={penalty!r} is out of range: {name} penalty must be finite")
    return penalty


def repetition_penalty_from_mask(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL repetition penalty on the tokens marked in `seen`.

    Args:
        logits: `(..., V)` scores.
        seen: `(..., V)` bool, True for tokens to penalise.
        penalty: r > 0; r > 1 discourages repeats, r < 1 encourages them, r = 1 is the identity.

    Returns:
        New float32 logits: positive seen logits divided by r, non-positive ones multiplied by r.

    Time complexity: O(V) per row.
    """
    penalty = _check_repetition(penalty)
    logits = float_logits(logits)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def frequency_penalty_from_counts(logits: Tensor, counts: Tensor, penalty: float) -> Tensor:
    """`logits - penalty * counts` with `counts (..., V)` token occurrence counts. O(V) per row."""
    penalty = _check_finite("frequency", penalty)
    return float_logits(logits) - penalty * counts


def presence_penalty_from_counts(logits: Tensor, counts: Tensor, penalty: float) -> Tensor:
    """`logits - penalty * 1[counts > 0]` with `counts (..., V)`. O(V) per row."""
    penalty = _check_finite("presence", penalty)
    return float_logits(logits) - penalty * (counts > 0).float()


def repetition_penalty(logits: Tensor, token_ids: TokenIds, penalty: float) -> Tensor:
    """CTRL repetition penalty on every token occurring in `token_ids (..., T)`.

    For v in token_ids: z_v / penalty if z_v > 0 else z_v * penalty (Keskar et al., 2019; the
    Hugging Face rule). Time complexity: O(T + V) per row.
    """
    logits = float_logits(logits)
    counts = token_counts(history_for(token_ids, logits), logits.shape[-1])
    return repetition_penalty_from_mask(logits, counts > 0, penalty)


def frequency_penalty(logits: Tensor, token_ids: TokenIds, penalty: float) -> Tensor:
    """`z_v - penalty * count_v`, count_v = occurrences of v in `token_ids (..., T)` (OpenAI).

    Time complexity: O(T + V) per row.
    """
    logits = float_logits(logits)
    counts = token_counts(history_for(token_ids, logits), logits.shape[-1])
    return frequency_penalty_from_counts(logits, counts, penalty)


def presence_penalty(logits: Tensor, token_ids: TokenIds, penalty: float) -> Tensor:
    """`z_v - penalty * 1[v occurs in token_ids (..., T)]` (OpenAI). O(T + V) per row."""
    logits = float_logits(logits)
    counts = token_counts(history_for(token_ids, logits), logits.shape[-1])
    return presence_penalty_from_counts(logits, counts, penalty)
