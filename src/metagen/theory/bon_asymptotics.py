r"""Best-of-N as KL-regularised RL, checked exactly: Yang et al. 2024, "Asymptotics of language
model alignment", Theorem 2.

A sequence y of m tokens drawn i.i.d. from p over K symbols, with a reward additive over its
tokens, r(y) = Σ_t r(y_t). The KL-constrained optimum at KL(φ ‖ pᵐ) ≤ mΔ is the product of the
per-token tilt φ_Δ = p·e^{λr}/Z with KL(φ_Δ ‖ p) = Δ (`tilt.alpha_for_kl` with q = softmax(r)).
With N = exp(mΔ) draws, best-of-N's sequence distribution π_N^m approaches it:

$$
\lim_{m \to \infty} \frac{1}{m}\, \mathrm{KL}\big(\pi_N^m \,\|\, \phi_\Delta^m\big) = 0,
\qquad N = e^{m\Delta}.
$$

(Why: a type t — the token counts of a sequence — has probability ≈ e^{−m KL(t‖p)} under pᵐ, so
N = e^{mΔ} draws reach every type inside the KL ball of radius Δ and none outside; the best of
them is the highest-reward type of the ball, which is where φ_Δᵐ concentrates.)

Computed exactly on types: the reward and both distributions depend on a sequence only through
its type, and both are uniform over the sequences of a type, so the sequence KL equals the KL
between type distributions. Best-of-N over types is `best_of_n.bon_pmf`'s F(C)^N − F⁻(C)^N per
tie class C (types of equal reward), shared by p within the class, computed here from the tail
masses above each class in log space: at N = e^{mΔ} the classes that matter have tail mass near
1/N, far below float64's resolution of 1 − F. There are C(m + K − 1, K − 1) types: O(m^{K−1})
memory and time per point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from metagen.theory.tilt import alpha_for_kl, tilt

MAX_TYPES = 2_000_000  # types enumerated per point


def sequence_types(k: int, m: int) -> np.ndarray:
    """Every count vector of m tokens over k symbols: (T, k) int, T = C(m + k − 1, k − 1) (stars
    and bars)."""
    if k < 1 or m < 0:
        raise ValueError(f"need k >= 1 symbols and m >= 0 tokens, got k={k}, m={m}")
    total = math.comb(m + k - 1, k - 1)
    if total > MAX_TYPES:
        raise ValueError(f"m={m} tokens over k={k} symbols give {total} types, more than {MAX_TYPES}: "
                         "use a smaller m or alphabet")
    return _types(k, m)


def _types(k: int, m: int) -> np.ndarray:
    """(T, k): the first count c = 0..m, then every type of m − c tokens over k − 1 symbols."""
    if k == 1:
        return np.array([[m]], dtype=np.int64)
    if k == 2:
        first = np.arange(m + 1, dtype=np.int64)
        return np.stack([first, m - first], axis=1)
    blocks = []
    for first in range(m + 1):
        rest = _types(k - 1, m - first)
        blocks.append(np.hstack([np.full((len(rest), 1), first, dtype=np.int64), rest]))
    return np.vstack(blocks)


def log_type_probability(counts: np.ndarray, p: np.ndarray) -> np.ndarray:
    """log of the multinomial probability of each type under i.i.d. p: (T,). Symbols with p = 0
    give −inf for types that use them."""
    m = counts.sum(axis=1)
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    terms = np.where(counts > 0, counts * log_p, 0.0)
    return gammaln(m + 1) - gammaln(counts + 1).sum(axis=1) + terms.sum(axis=1)


def bon_over_outcomes(log_p: np.ndarray, rewards: np.ndarray, n: int) -> np.ndarray:
    """Best-of-n's distribution (K,) over outcomes of log-probabilities `log_p` (K,) and rewards
    (K,), ties broken within a class by p (as `best_of_n.bon_pmf`), accurate for any n whose
    relevant tail masses are far below 1e-16. With S(C), S⁻(C) the masses of rewards > r(C),
    ≥ r(C): mass(C) = (1 − S)^n − (1 − S⁻)^n = −(1 − S)^n · expm1(n·(log1p(−S⁻) − log1p(−S))).
    O(K log K)."""
    log_p = np.asarray(log_p, dtype=np.float64)
    order = np.argsort(-np.asarray(rewards, dtype=np.float64), kind="stable")
    values, starts = np.unique(-np.asarray(rewards, dtype=np.float64)[order], return_index=True)
    log_class = np.logaddexp.reduceat(log_p[order], starts)  # (C,) log p(C), best class first
    log_total = np.logaddexp.reduce(log_class)
    log_class = log_class - log_total  # renormalised
    log_at_least = np.logaddexp.accumulate(log_class)  # log S⁻(C)
    log_above = np.concatenate([[-np.inf], log_at_least[:-1]])  # log S(C)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        survive_above = np.log1p(-np.minimum(np.exp(log_above), 1.0))  # log(1 − S), −inf where S = 1
        survive_at_least = np.log1p(-np.minimum(np.exp(log_at_least), 1.0))
        class_mass = -np.exp(n * survive_above) * np.expm1(n * (survive_at_least - survive_above))
    class_mass = np.nan_to_num(class_mass, nan=0.0)
    class_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(order))))  # (K,) in sorted order
    chosen = np.zeros_like(log_p)
    share = np.exp(log_p[order] - log_total - log_class[class_of])  # p(y) / p(C)
    chosen[order] = class_mass[class_of] * share
    return chosen


@dataclass(frozen=True)
class AsymptoticsPoint:
    """One sequence length m: N = round(e^{mΔ}) draws; kl_per_token = KL(π_N^m ‖ φ_Δ^m)/m;
    bon_reward, tilt_reward: expected reward per token of best-of-N and of the tilt;
    bon_kl_per_token: KL(π_N^m ‖ p^m)/m (→ Δ)."""

    m: int
    n: int
    kl_per_token: float
    bon_reward: float
    tilt_reward: float
    bon_kl_per_token: float


def bon_against_tilt(p, r, delta: float, m: int) -> AsymptoticsPoint:
    """Best-of-N at N = round(e^{mΔ}) (at least 1) over m-token sequences of i.i.d. p with additive
    reward r, against the KL-Δ tilt φ_Δ^m; p, r: (K,), Δ in (0, KL reach of the tilt)."""
    p = np.asarray(p, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if p.ndim != 1 or p.shape != r.shape or abs(p.sum() - 1.0) > 1e-9 or np.any(p <= 0):
        raise ValueError("p must be a (K,) probability vector with every entry > 0, r a (K,) array like it")
    if not delta > 0:
        raise ValueError(f"delta={delta} is out of range: must be > 0")
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"m={m} is out of range: must be an int >= 1")
    if m * delta > 700:
        raise ValueError(f"m·delta = {m * delta:g} makes N = e^(m·delta) overflow: keep it <= 700")
    q = np.exp(r - r.max())
    q /= q.sum()
    phi = tilt(p, q, alpha_for_kl(p, q, delta))
    counts = sequence_types(len(p), m)
    log_base = log_type_probability(counts, p)
    log_phi = log_type_probability(counts, phi)
    rewards = counts @ r  # (T,)
    n = max(1, round(math.exp(m * delta)))
    chosen = bon_over_outcomes(log_base, rewards, n)
    support = chosen > 0
    with np.errstate(divide="ignore"):
        log_chosen = np.log(chosen[support])
    kl_tilt = float(np.sum(chosen[support] * (log_chosen - log_phi[support])))
    kl_base = float(np.sum(chosen[support] * (log_chosen - log_base[support])))
    return AsymptoticsPoint(m, n, max(kl_tilt, 0.0) / m, float(chosen @ rewards) / m, float(phi @ r),
                            max(kl_base, 0.0) / m)


def asymptotics_curve(p, r, delta: float, lengths) -> list[AsymptoticsPoint]:
    """`bon_against_tilt` at every m of `lengths`."""
    return [bon_against_tilt(p, r, delta, int(m)) for m in lengths]
