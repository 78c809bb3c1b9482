"""Mirostat 2.0 (Basu, Ramachandran, Keskar and Varshney, 2021, "Mirostat: A Neural Text
Decoding Algorithm that Directly Controls Perplexity"; version 2 from the authors' reference
implementation).

A feedback controller that keeps the surprise of the sampled tokens near a target tau (bits),
hence the perplexity near 2^tau. Each row carries a threshold mu, initialised to 2 tau:

    surprise(v) = -log2 p(v)
    keep(v)     = surprise(v) <= mu      (the top token is always kept)
    x ~ softmax over the kept tokens
    s = -log2 p(x)                       observed surprise, under the untruncated p
    mu <- mu - learning_rate * (s - tau)

A surprising choice lowers mu (fewer tokens next time), an unsurprising one raises it. The
observed surprise uses the distribution before truncation, as in the authors' reference
implementation; llama.cpp uses the renormalised probability instead.

Mirostat replaces the other truncations (top-k, top-p, ...); temperature and penalties may come
before it. Time complexity: O(V) per row and step, state O(B).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ._common import LOG_TOLERANCE, float_logits, keep_argmax, keep_only
from ._history import RowHistory
from .processor import LogitsProcessor
from .sample import sample

LN2 = math.log(2.0)


def mirostat_truncate(logits: Tensor, mu: Tensor) -> Tensor:
    """Remove tokens whose surprise `-log2 p` exceeds `mu`; always keep the top token.

    Args:
        logits: `(B, V)` scores.
        mu: `(B,)` surprise thresholds in bits.

    Returns:
        New float32 logits `(B, V)`. O(V) per row.
    """
    logits = float_logits(logits)
    surprise = -torch.log_softmax(logits, dim=-1) / LN2  # (B, V) bits
    within = surprise <= mu.to(logits.device).float().unsqueeze(-1) + LOG_TOLERANCE / LN2
    return keep_only(logits, keep_argmax(logits, within))


def mirostat_update(
    mu: Tensor, log_probs: Tensor, tokens: Tensor, tau: float, learning_rate: float
) -> Tensor:
    """New thresholds `mu - learning_rate * (s - tau)` with `s = -log2 p(token)`.

    Args:
        mu: `(B,)` current thresholds.
        log_probs: `(B, V)` natural-log probabilities of the untruncated distribution.
        tokens: `(B,)` chosen tokens; rows with a negative token keep their mu.
        tau: target surprise in bits.
        learning_rate: step size of the controller.

    Returns:
        New `(B,)` float32 thresholds. O(B).
    """
    tokens = tokens.reshape(-1, 1).to(device=log_probs.device, dtype=torch.long)  # (B, 1)
    surprise = -log_probs.gather(1, tokens.clamp(min=0)).squeeze(1) / LN2  # (B,)
    new_mu = mu - learning_rate * (surprise - tau)
    return torch.where(tokens.squeeze(1) >= 0, new_mu, mu)


class Mirostat(LogitsProcessor):
    """Mirostat 2.0 sampler of B rows with explicit state `mu (B,)` (a `LogitsProcessor`).

    One step is `apply` (truncate) -> choose a token -> `accept(tokens)`; `sample` does all three.
    `apply` remembers the untruncated log-probabilities for the next `accept`. For `rollback` the
    mu before each accepted token is logged per row (`RowHistory`).
    """

    name = "mirostat"
    argmax_invariant = True  # the top token is always kept

    def __init__(self, tau: float, learning_rate: float, mu: Tensor) -> None:
        tau, learning_rate = float(tau), float(learning_rate)
        if not (tau > 0 and math.isfinite(tau)):
            raise ValueError(f"tau={tau!r} is out of range: must be in (0, inf)")
        if not (0 < learning_rate <= 1):
            raise ValueError(f"learning_rate={learning_rate!r} is out of range: must be in (0, 1]")
        self.tau = tau
        self.learning_rate = learning_rate
        self.mu = mu.float()  # (B,)
        self._log_probs: Tensor | None = None  # (B, V) of the last `apply`
        self._mu_before = RowHistory(self.mu.new_zeros(self.mu.shape[0], 0), math.nan)

    @classmethod
    def create(
        cls,
        batch_size: int,
        tau: float,
        learning_rate: float = 0.1,
        device: torch.device | str | None = None,
    ) -> Mirostat:
        """B rows with mu = 2 tau (the paper's initialisation)."""
        return cls(tau, learning_rate, torch.full((batch_size,), 2.0 * float(tau), device=device))

    @property
    def batch_size(self) -> int:
        return self.mu.shape[0]

    def apply(self, logits: Tensor) -> Tensor:
        """Truncate `logits (B, V)` at each row's mu; returns new float32 logits."""
        logits = float_logits(logits)
        self._log_probs = torch.log_softmax(logits, dim=-1)
        return mirostat_truncate(logits, self.mu)

    process = apply

    def accept(self, tokens: Tensor) -> None:
        """Move mu towards tau given the tokens `(B,)` chosen from the last `apply`."""
        if self._log_probs is None:
            raise RuntimeError("Mirostat.accept needs the distribution of a previous apply (process)")
        tokens = tokens.reshape(-1).to(self.mu.device)
        self._mu_before.accept(self.mu, tokens >= 0)
        self.mu = mirostat_update(self.mu, self._log_probs, tokens, self.tau, self.learning_rate)
        self._log_probs = None

    def rollback(self, counts: Tensor) -> None:
        """Give each row the mu it had before its last `counts[b]` accepted tokens."""
        removed = self._mu_before.rollback(counts)
        first = removed.mask.long().argmax(dim=1, keepdim=True)  # (B, 1) earliest removed entry
        restored = removed.values.gather(1, first).squeeze(1) if removed.values.shape[1] else self.mu
        self.mu = torch.where(removed.mask.any(dim=1), restored, self.mu)
        self._log_probs = None

    def reset(self) -> None:
        """mu as it was right after the prompt."""
        self.rollback(self._mu_before.accepted)

    def sample(self, logits: Tensor, generator: torch.Generator | None) -> Tensor:
        """One full step: truncate, sample `(B,)` tokens with `generator`, update mu."""
        tokens = sample(self.apply(logits), generator)
        self.accept(tokens)
        return tokens

    def select(self, indices: Tensor) -> None:
        """Keep rows `indices (B',)` in that order, in place (follows a KV-cache reorder)."""
        indices = indices.to(device=self.mu.device, dtype=torch.long)
        self.mu = self.mu[indices]
        self._mu_before.select(indices)
        if self._log_probs is not None:
            self._log_probs = self._log_probs[indices]

    def fork(self, indices: Tensor) -> Mirostat:
        """A new, independent sampler made of rows `indices (B',)`; this one is unchanged."""
        indices = indices.to(device=self.mu.device, dtype=torch.long)
        forked = Mirostat(self.tau, self.learning_rate, self.mu[indices])
        forked._mu_before = self._mu_before.fork(indices)
        if self._log_probs is not None:
            forked._log_probs = self._log_probs[indices]
        return forked

    @classmethod
    def concat(cls, parts: Sequence[Mirostat]) -> Mirostat:
        """The rows of `parts` (same tau and learning rate) in one sampler, between steps."""
        joined = Mirostat(parts[0].tau, parts[0].learning_rate, torch.cat([p.mu for p in parts]))
        joined._mu_before = RowHistory.concat([p._mu_before for p in parts])
        return joined
