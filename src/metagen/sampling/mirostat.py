"""Mirostat 1.0 and 2.0 (Basu, Ramachandran, Keskar and Varshney, 2021, "Mirostat: A Neural Text
Decoding Algorithm that Directly Controls Perplexity"; version 2 from the authors' reference
implementation).

A feedback controller that keeps the surprise of the sampled tokens near a target tau (bits),
hence the perplexity near 2^tau. Each row carries mu, initialised to 2 tau, and truncates by it:

    version 2:  keep(v) = -log2 p(v) <= mu                 (the top token is always kept)
    version 1:  keep the k most likely tokens, k from a Zipf fit of the top m = 100:
                s^ = sum_i t_i b_i / sum_i t_i^2,   t_i = ln((i+1)/i), b_i = ln(p_(i) / p_(i+1)),
                                                      i = 1..m-1 over the sorted probabilities
                e^ = s^ - 1,   k = round((e^ 2^mu / (1 - V^(-e^)))^(1/s^))   (clamped to [1, V])
    x ~ softmax over the kept tokens
    s = -log2 p(x)                       observed surprise, under the untruncated p
    mu <- mu - learning_rate * (s - tau)

Version 1 (the paper's Algorithm 1) chooses k so that a Zipf distribution of exponent s^ would
have expected surprise mu over its top k; version 2 drops the estimate and cuts at surprise mu
directly. A surprising choice lowers mu (fewer tokens next time), an unsurprising one raises it.
The observed surprise uses the distribution before truncation, as in the authors' reference
implementation; llama.cpp uses the renormalised probability instead.

Mirostat replaces the other truncations (top-k, top-p, ...); temperature and penalties may come
before it. Time complexity: version 2 O(V) per row and step; version 1 O(V log k) (a top-k for
the k-th logit), state O(B).
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
ZIPF_TOKENS = 100  # m: the top probabilities the Zipf exponent is fitted on (the paper's choice)
VERSIONS = (1, 2)


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


def zipf_exponent(logits: Tensor, m: int = ZIPF_TOKENS) -> Tensor:
    """Least-squares Zipf exponent s^ of each row's top `m` probabilities (module docstring).

    Args:
        logits: `(B, V)` scores.
        m: how many of the most likely tokens the fit reads (fewer when V or the finite logits are
            fewer); pairs with a removed (-inf) token are left out.

    Returns:
        `(B,)` float64 exponents; a row with fewer than two finite logits gets 0. O(V + m) per row.
    """
    m = min(m, logits.shape[-1])
    top = torch.topk(float_logits(logits).double(), m, dim=-1).values  # (B, m), sorted
    b = top[:, :-1] - top[:, 1:]  # (B, m-1) = ln(p_(i) / p_(i+1)); the normaliser cancels
    i = torch.arange(1, m, dtype=torch.float64, device=logits.device)
    t = torch.log((i + 1) / i)  # (m-1,)
    valid = torch.isfinite(b)
    b = torch.where(valid, b, torch.zeros_like(b))
    t = torch.where(valid, t, torch.zeros_like(b))  # (B, m-1)
    num, den = (t * b).sum(-1), (t * t).sum(-1)
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))


def zipf_top_k(s: Tensor, mu: Tensor, vocab_size: int) -> Tensor:
    """k = round((e^ 2^mu / (1 - V^(-e^)))^(1/s^)), e^ = s^ - 1, clamped to [1, V]: `(B,)` ints.

    At e^ = 0 the ratio is its limit 2^mu / ln V. The formula needs s^ > 0; a row with s^ <= 0
    (a flat top, or fewer than two finite logits) keeps all V tokens: the Zipf law of exponent 0
    is the uniform distribution, which no k below V describes (removed tokens stay removed)."""
    s, mu = s.double(), mu.double().to(s.device)
    e = s - 1.0
    small = e.abs() < 1e-9
    safe_e = torch.where(small, torch.ones_like(e), e)
    ratio = torch.where(small, torch.exp2(mu) / math.log(vocab_size),
                        safe_e * torch.exp2(mu) / (1.0 - float(vocab_size) ** (-safe_e)))
    k = torch.where(s > 0, ratio.clamp(min=0.0) ** (1.0 / s.clamp(min=1e-12)), torch.full_like(s, vocab_size))
    k = torch.nan_to_num(k, nan=float(vocab_size), posinf=float(vocab_size))
    return torch.round(k).clamp(1, vocab_size).long()


def mirostat_v1_truncate(logits: Tensor, mu: Tensor) -> Tensor:
    """Keep each row's k most likely tokens, k from the Zipf fit and mu (`zipf_top_k`); ties
    with the k-th logit are kept, as top-k keeps them.

    Args:
        logits: `(B, V)` scores.
        mu: `(B,)` targets in bits.

    Returns:
        New float32 logits `(B, V)`. O(V log k) per row (a top-k of the largest k of the batch).
    """
    logits = float_logits(logits)
    k = zipf_top_k(zipf_exponent(logits), mu, logits.shape[-1])  # (B,)
    largest = torch.topk(logits, int(k.max()), dim=-1).values  # (B, max k), sorted: no full sort when k is small
    kth = largest.gather(1, (k - 1).to(logits.device)[:, None])  # (B, 1)
    return keep_only(logits, keep_argmax(logits, logits >= kth))


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
    """Mirostat (version 1 or 2) sampler of B rows with explicit state `mu (B,)` (a `LogitsProcessor`).

    One step is `apply` (truncate) -> choose a token -> `accept(tokens)`; `sample` does all three.
    `apply` remembers the untruncated log-probabilities for the next `accept`. For `rollback` the
    mu before each accepted token is logged per row (`RowHistory`).
    """

    name = "mirostat"
    argmax_invariant = True  # the top token is always kept

    def __init__(self, tau: float, learning_rate: float, mu: Tensor, version: int = 2) -> None:
        tau, learning_rate = float(tau), float(learning_rate)
        if version not in VERSIONS or isinstance(version, bool):
            raise ValueError(f"version={version!r} is out of range: must be 1 or 2")
        if not (tau > 0 and math.isfinite(tau)):
            raise ValueError(f"tau={tau!r} is out of range: must be in (0, inf)")
        if not (0 < learning_rate <= 1):
            raise ValueError(f"learning_rate={learning_rate!r} is out of range: must be in (0, 1]")
        self.tau = tau
        self.learning_rate = learning_rate
        self.version = version
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
        version: int = 2,
    ) -> Mirostat:
        """B rows with mu = 2 tau (the paper's initialisation)."""
        return cls(tau, learning_rate, torch.full((batch_size,), 2.0 * float(tau), device=device), version)

    @property
    def batch_size(self) -> int:
        return self.mu.shape[0]

    def apply(self, logits: Tensor) -> Tensor:
        """Truncate `logits (B, V)` by each row's mu; returns new float32 logits."""
        logits = float_logits(logits)
        self._log_probs = torch.log_softmax(logits, dim=-1)
        if self.version == 1:
            return mirostat_v1_truncate(logits, self.mu)
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
        forked = Mirostat(self.tau, self.learning_rate, self.mu[indices], self.version)
        forked._mu_before = self._mu_before.fork(indices)
        if self._log_probs is not None:
            forked._log_probs = self._log_probs[indices]
        return forked

    @classmethod
    def concat(cls, parts: Sequence[Mirostat]) -> Mirostat:
        """The rows of `parts` (same tau, learning rate and version) in one sampler, between steps."""
        joined = Mirostat(parts[0].tau, parts[0].learning_rate, torch.cat([p.mu for p in parts]), parts[0].version)
        joined._mu_before = RowHistory.concat([p._mu_before for p in parts])
        return joined
