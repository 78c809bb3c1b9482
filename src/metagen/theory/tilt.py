r"""KL-constrained alignment in closed form: the mismatched tilt and the KL-regularized optimum.

With a reward r(y) = log q(y) (q the "alignment distribution"), the policy that maximises the
expected reward subject to KL(φ ‖ p) ≤ Δ is the mismatched tilt (Salamatian et al. 2019;
Yang et al. 2024, "Asymptotics of language model alignment", Lemma 1):

$$
T(q, p, \alpha)(y) = \frac{p(y)\, q(y)^\alpha}{Z_\alpha}, \qquad Z_\alpha = \sum_z p(z)\, q(z)^\alpha, \qquad
\alpha = \alpha(\Delta) \text{ solving } \mathrm{KL}(T_\alpha \,\|\, p) = \Delta.
$$

The KL-regularized RL optimum $\pi^*(y) = p(y) \exp(r(y)/\beta) / Z$ is the same family with
$q = \operatorname{softmax}(r)$, $\alpha = 1/\beta$. KL(T_α ‖ p) grows with α (its derivative is α·Var_{T_α}[log q] ≥ 0)
towards −log p(S), S = the outcomes of p's support where q is largest, so α(Δ) is one
bracketed root find. Shapes: p, q, r: (K,). Each evaluation is O(K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from metagen.theory.best_of_n import kl_divergence


def _probabilities(values, name: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or np.any(values < 0) or abs(values.sum() - 1.0) > 1e-6:
        raise ValueError(f"{name} must be a non-empty probability vector (K,)")
    return values / values.sum()


def _tilt_logits(p: np.ndarray, log_q: np.ndarray, alpha: float) -> np.ndarray:
    """log p + α (log q − max log q), with 0·log 0 = 0 at α = 0 and −inf outside p's support.

    Subtracting max log q changes only Z, and keeps α·(log q_i − log q_j) exact when q is nearly
    tied and α is huge (α·log q_i alone would lose the difference to rounding).
    """
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    return log_p if alpha == 0 else log_p + alpha * (log_q - np.max(log_q))


def _normalise(logits: np.ndarray) -> np.ndarray:
    top = np.max(logits)
    if not np.isfinite(top):
        raise ValueError("the tilt has no mass: q is 0 on all of p's support")
    weights = np.exp(logits - top)
    return weights / weights.sum()


def tilt(p, q, alpha: float) -> np.ndarray:
    """T(q, p, α) = p·q^α / Z_α: (K,). α ≥ 0; α = 0 gives p, α → ∞ gives p restricted to argmax q."""
    p, q = _probabilities(p, "p"), _probabilities(q, "q")
    if not alpha >= 0 or not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    with np.errstate(divide="ignore"):
        log_q = np.log(q)
    return _normalise(_tilt_logits(p, log_q, alpha))


def max_tilt_kl(p, q) -> float:
    """sup_α KL(T_α ‖ p) = −log p(S), S = outcomes with p > 0 where q is largest."""
    p, q = _probabilities(p, "p"), _probabilities(q, "q")
    support = p > 0
    top = q[support].max()
    return float(-math.log(p[support & (q == top)].sum()))


def alpha_for_kl(p, q, delta: float, *, tolerance: float = 1e-12) -> float:
    """α(Δ) ≥ 0 with KL(T(q, p, α) ‖ p) = Δ.

    Raises ValueError when Δ < 0 or Δ ≥ the largest reachable KL, −log p(S) (see `max_tilt_kl`).
    O(K) per bracket doubling and per Brent step (about 50 steps in all).
    """
    p, q = _probabilities(p, "p"), _probabilities(q, "q")
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    reachable = max_tilt_kl(p, q)
    if delta >= reachable:
        raise ValueError(
            f"KL delta={delta} is out of reach: the tilt family approaches KL = {reachable:.6g} "
            "(−log p of q's argmax set) only as alpha → ∞"
        )
    if delta == 0:
        return 0.0

    def gap(alpha: float) -> float:
        return kl_divergence(tilt(p, q, alpha), p) - delta

    if gap(0.0) >= 0:  # Δ below the rounding of KL(p ‖ p)
        return 0.0
    high = 1.0
    while gap(high) < 0:  # KL is increasing in α and tends to `reachable` > Δ, so this ends
        high *= 2.0
        if high > 1e300:
            raise ValueError(f"KL delta={delta} is numerically out of reach (limit {reachable:.6g})")
    return float(brentq(gap, 0.0, high, xtol=tolerance, rtol=4 * np.finfo(float).eps, maxiter=500))


@dataclass(frozen=True)
class KLRegularizedOptimum:
    """The optimum of E_π[r] − β KL(π ‖ p).

    policy: (K,) π* = p·exp(r/β)/Z.
    expected_reward: E_{π*}[r].
    kl: KL(π* ‖ p) in nats.
    """

    policy: np.ndarray
    expected_reward: float
    kl: float


def kl_regularized_optimum(p, r, beta: float) -> KLRegularizedOptimum:
    """π*(y) = p(y) exp(r(y)/β) / Z, its expected reward and its KL. Sweeping β traces the optimal reward–KL frontier that
    best-of-n's (bon_kl, E_{π⁽ⁿ⁾}[r]) points lie on or below. β > 0 (β → ∞ gives p). O(K).
    """
    p = _probabilities(p, "p")
    r = np.asarray(r, dtype=np.float64)
    if r.shape != p.shape or not np.all(np.isfinite(r)):
        raise ValueError(f"r must be a finite (K,) array like p, got shape {r.shape}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    with np.errstate(divide="ignore"):
        policy = _normalise(np.log(p) + r / beta)
    return KLRegularizedOptimum(policy, float(policy @ r), kl_divergence(policy, p))
