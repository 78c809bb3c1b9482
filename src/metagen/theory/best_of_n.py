r"""Best-of-n over a finite outcome set: exact PMF, KL to the base policy, bound, estimator, win rate.

Best-of-n draws $y_1, \dots, y_n$ i.i.d. from the base policy p and returns the draw with the
highest reward r. Over K outcomes (Beirami et al. 2024, "Theoretical guarantees on the best-of-n
alignment policy"):

$$
\begin{gathered}
\pi^{(n)}(y) = F(y)^n - F^-(y)^n, \\
F(y) = P_{z \sim p}[r(z) \le r(y)], \qquad F^-(y) = P_{z \sim p}[r(z) < r(y)].
\end{gathered}
$$

Ties. The formula assumes distinct rewards. Here ties are broken uniformly at random
among the tied *draws*, so a tie class C (outcomes sharing one reward) receives the probability
that the maximum reward of the n draws is its reward, F(C)ⁿ − F⁻(C)ⁿ, and the drawn member is
a p-distributed member of C: $\pi^{(n)}(y) = (F(y)^n - F^-(y)^n) \cdot p(y) / p(C)$. With
distinct rewards p(C) = p(y) and this is the formula above.

Shapes: p, r: (K,) array-likes; p ≥ 0 summing to 1 (renormalised after a 1e-6 check).
Every function here is O(K log K) (one sort).
"""

from __future__ import annotations

import math

import numpy as np


def _check(p, r) -> tuple[np.ndarray, np.ndarray]:
    """p, r as float64 (K,) arrays; p normalised."""
    p = np.asarray(p, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if p.ndim != 1 or p.shape != r.shape or p.size == 0:
        raise ValueError(f"p and r must be non-empty (K,) arrays of one shape, got {p.shape} and {r.shape}")
    if np.any(p < 0) or not np.all(np.isfinite(p)) or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"p must be a probability vector (non-negative, sums to 1), sums to {p.sum()}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    return p / p.sum(), r


def _check_n(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    return int(n)


def reward_cdf(p, r) -> tuple[np.ndarray, np.ndarray]:
    """F(y) = P[r(z) ≤ r(y)] and F⁻(y) = P[r(z) < r(y)] for every outcome, each (K,)."""
    p, r = _check(p, r)
    order = np.argsort(r, kind="stable")
    sorted_r = r[order]
    cumulative = np.concatenate([[0.0], np.cumsum(p[order])])  # (K + 1,)
    cumulative[-1] = 1.0  # the top class has F = 1 exactly, not 1 − rounding
    at_most = cumulative[np.searchsorted(sorted_r, r, side="right")]
    below = cumulative[np.searchsorted(sorted_r, r, side="left")]
    return np.minimum(at_most, 1.0), np.minimum(below, at_most)


def _class_mass(at_most: np.ndarray, below: np.ndarray, n: int) -> np.ndarray:
    """F ⁿ − F⁻ⁿ = −Fⁿ·expm1(n·log(F⁻/F)), accurate when F⁻ is close to F."""
    with np.errstate(divide="ignore"):
        ratio_log = np.where(at_most > 0, np.log(below) - np.log(np.where(at_most > 0, at_most, 1.0)), 0.0)
    return np.where(at_most > 0, -(at_most**n) * np.expm1(n * ratio_log), 0.0)


def bon_pmf(p, r, n: int) -> np.ndarray:
    """π⁽ⁿ⁾: (K,), the distribution of the best of n draws from p under reward r (ties as above)."""
    p, r = _check(p, r)
    n = _check_n(n)
    at_most, below = reward_cdf(p, r)
    class_probability = at_most - below  # p(C) of each outcome's tie class
    share = np.divide(p, class_probability, out=np.zeros_like(p), where=class_probability > 0)
    return _class_mass(at_most, below, n) * share


def kl_divergence(a, b) -> float:
    """KL(a ‖ b) = Σ a log(a / b) in nats over a's support (inf if b = 0 where a > 0)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    support = a > 0
    if np.any(b[support] <= 0):
        return math.inf
    return float(max(np.sum(a[support] * np.log(a[support] / b[support])), 0.0))


def bon_kl(p, r, n: int) -> float:
    """Exact KL(π⁽ⁿ⁾ ‖ p) in nats. With ties π⁽ⁿ⁾/p is constant on a tie class, so this is the
    KL of the class-level policy, to which the bound of Theorem 2 applies."""
    return kl_divergence(bon_pmf(p, r, n), _check(p, r)[0])


def bon_kl_bound(n: int) -> float:
    """log n − (n − 1)/n: the "analytical formula", an upper bound on KL(π⁽ⁿ⁾ ‖ p) for every p, r
    (Theorem 2, Beirami et al. 2024), tight when no outcome has much mass (n·ε ≪ 1)."""
    n = _check_n(n)
    return math.log(n) - (n - 1) / n


def bon_kl_estimate(eps, n: int):
    """The estimator KL̂(εₙ) of Beirami et al. 2024 (Approximation 1), εₙ = p(y) for y ∼ π⁽ⁿ⁾:

        KL̂(ε) = (1 − ε)ⁿ (log n + (n − 1) log(1 − ε) − (n − 1)/n)
                + (1 − (1 − ε)ⁿ) log((1 − (1 − ε)ⁿ) / ε).

    It is the exact KL when the selected outcome is the top-reward atom of mass ε and the rest of
    p is spread over infinitely many tiny outcomes. eps: scalar or array in (0, 1]; same shape out.
    """
    n = _check_n(n)
    eps = np.asarray(eps, dtype=np.float64)
    if np.any(~(eps > 0)) or np.any(eps > 1):
        raise ValueError("eps must lie in (0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_survive = np.log1p(-eps)  # log(1 − ε), −inf at ε = 1
        rest = -np.expm1(n * log_survive)  # 1 − (1 − ε)ⁿ, accurate for small ε
        bracket = math.log(n) + (n - 1) * log_survive - (n - 1) / n
        continuous = np.where(eps < 1, np.exp(n * log_survive) * bracket, 0.0)  # (1 − ε)ⁿ(…), 0 at ε = 1
    value = continuous + rest * np.log(rest / eps)
    return float(value) if value.ndim == 0 else value


def bon_win_rate(p, r, n: int) -> float:
    """P[r(y) > r(z)] + ½·P[r(y) = r(z)] for y ∼ π⁽ⁿ⁾, z ∼ p (Beirami et al. 2024, Lemma 1):

        win-rate = 1 − ½ E_{y∼p}[F(y)ⁿ + F⁻(y)ⁿ] ≤ n/(n + 1),

    with equality when no two of n + 1 draws can tie. Independent of how ties are broken.
    """
    p, r = _check(p, r)
    n = _check_n(n)
    at_most, below = reward_cdf(p, r)
    return float(1.0 - 0.5 * np.sum(p * (at_most**n + below**n)))
