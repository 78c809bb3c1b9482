"""Choosing a token from logits: ancestral sampling, greedy argmax, and token log-probabilities.

    sample:  x ~ softmax(z)          (inverse CDF; -inf logits have probability 0)
    greedy:  x = argmax_v z_v        (the first index among ties)

What logits may hold: finite values and -inf (a removed token). NaN and +inf are refused, and
so is a row where every logit is -inf (nothing left to choose): `check_choosable` raises
ValueError naming the row, the token and the reason (`EmptiedRowError`, a ValueError, for a row
with nothing left). `sample` and `greedy` run it on what they choose from: one reduction over the
logits and one host synchronisation per call (15-40 us for one row of V = 49152 on CPU).

In a decoding loop the one full check is at the chain boundary: `SamplerChain.process` checks its
input before any adapter, and `SamplerChain.choose` draws with `draw` / `argmax` (the same choice
without the check) and looks only at what it chose, O(B): a row whose chosen logit is not finite
(greedy) or whose total mass is not positive (a draw) is one the checks would refuse, and only
then is `check_choosable` run, for its message.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._common import float_logits


class EmptiedRowError(ValueError):
    """A row of logits where every token is -inf: nothing is left to choose. `row` is its index;
    `processors` the names of the processors that removed every token, when known (a
    `SamplerChain` adds them)."""

    def __init__(self, row: tuple[int, ...], processors: tuple[str, ...] = (), fields: tuple[str, ...] = ()) -> None:
        self.row, self.processors = row, processors
        where = f"logits row {row} is all -inf (every token was removed)"
        if processors:
            message = (f"{where} by the processors {' -> '.join(processors)}: the settings {', '.join(fields)} "
                       "leave no token that all of them allow; drop or loosen one")
        else:
            message = f"{where}: NaN and +inf logits are refused (-inf marks a removed token)"
        super().__init__(message)


def check_choosable(logits: Tensor) -> None:
    """Raise ValueError unless every row of `logits (..., V)` has a finite maximum.

    The row maximum is NaN if the row contains NaN, +inf if it contains +inf, and -inf if every
    entry is -inf; a finite maximum therefore rules out all three. O(V) per row; the bad token
    is looked up only when there is one.
    """
    row_max = logits.amax(dim=-1)  # (...)
    bad = ~torch.isfinite(row_max)
    if bool(bad.any()):
        row = tuple(int(i) for i in bad.nonzero()[0])
        for name, found in (("NaN", torch.isnan(logits[row])), ("+inf", torch.isposinf(logits[row]))):
            if bool(found.any()):
                raise ValueError(f"logits row {row} token {int(found.nonzero()[0])} is {name}: NaN and +inf logits "
                                 "are refused (-inf marks a removed token)")
        raise EmptiedRowError(row)


def sample(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row from softmax(logits).

    Args:
        logits: `(..., V)` scores; `-inf` marks removed tokens.
        generator: source of randomness (pass one for reproducible draws).

    Returns:
        `(...)` LongTensor of token ids.

    Time complexity: O(V) per row.
    """
    logits = float_logits(logits)
    check_choosable(logits)
    return draw(logits, generator)[0]


def draw(logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """`sample` without the check: `(tokens (...), ok (...))`, ok False for a row that `check_choosable`
    would refuse (its total mass is NaN or 0: a NaN, +inf or every token -inf), whose token is
    meaningless. `logits` float32. O(V) per row."""
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    # Inverse-CDF draw: token = first v with F(v) > u·F(V), u ~ U[0, 1). Removed tokens add 0 to
    # F, so they are never chosen. One softmax, one cumsum and a binary search per row — several
    # times faster on CPU than torch.multinomial over a 49k vocabulary.
    cdf = torch.softmax(flat, dim=-1).cumsum(dim=-1)  # (N, V)
    u = torch.rand((flat.shape[0], 1), generator=generator, dtype=cdf.dtype)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=flat.shape[-1] - 1)
    ok = cdf[:, -1] > 0  # NaN > 0 is False
    return tokens.reshape(logits.shape[:-1]), ok.reshape(logits.shape[:-1])


def greedy(logits: Tensor) -> Tensor:
    """The argmax token of each row: `(..., V) -> (...)` LongTensor; ties go to the lowest id.

    Time complexity: O(V) per row.
    """
    logits = float_logits(logits)
    check_choosable(logits)
    return logits.argmax(dim=-1)


def argmax(logits: Tensor) -> tuple[Tensor, Tensor]:
    """`greedy` without the check: `(tokens (...), ok (...))`, ok False for a row that
    `check_choosable` would refuse (the argmax propagates NaN, so a row's chosen logit is finite
    unless it holds NaN or +inf or is all -inf). O(V) per row."""
    tokens = logits.argmax(dim=-1)
    return tokens, torch.isfinite(logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))


class TokenLogprobs(NamedTuple):
    """Log-probabilities reported with each chosen token (OpenAI `logprobs`)."""

    chosen: Tensor  # (B,) log p(chosen token)
    top_values: Tensor  # (B, k) the k largest log-probabilities, descending
    top_ids: Tensor  # (B, k) their token ids


def token_logprobs(logits: Tensor, tokens: Tensor, num_top: int = 0) -> TokenLogprobs:
    """Log-probabilities of `tokens (...)` under softmax(logits (..., V)), plus the top `num_top`.

    Which logits to pass is the caller's choice: the model's raw logits report the model's
    probabilities (OpenAI and vLLM's default), processed logits report the sampled distribution.
    Time complexity: O(V + k log k) per row.
    """
    log_probs = torch.log_softmax(float_logits(logits), dim=-1)
    chosen = log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    top = torch.topk(log_probs, min(num_top, log_probs.shape[-1]), dim=-1)
    return TokenLogprobs(chosen, top.values, top.indices)
