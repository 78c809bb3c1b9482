"""Reward modelling: Bradley–Terry fits, Elo, and InfAlign's calibrate-and-transform rewards.

Bradley–Terry (Bradley & Terry 1952): p(y₁ ≺ y₂) = σ(r(y₂) − r(y₁)).
Elo: E_A = 1 / (1 + 10^((R_B − R_A)/400)), Bradley–Terry on the scale 400 / ln 10.

InfAlign (Balashankar et al. 2024) aligns for an inference-time procedure by running
KL-regularized RL on a transformed *calibrated* reward:
- calibrate: C(x, y) = P_{z∼p(·|x)}[r(x, z) ≤ r(x, y)], the CDF of the reward under base-policy
  samples for the same prompt (uniform on [0, 1] for y ∼ p when rewards do not tie, and unchanged
  by any increasing map of r);
- transform: Φ(C) with Φ_t(u) = exp(t·u) for best-of-N sampling and Φ_t(u) = −exp(−t·u) for
  best-of-N jailbreaking (worst-of-N), t > 0 a tuned temperature; the identity for plain
  sampling (standard win rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.special import expit, log_expit


def elo_expected(ra, rb):
    """Expected score of a player rated ra against one rated rb: 1 / (1 + 10^((rb − ra)/400))."""
    return expit((np.asarray(ra, dtype=np.float64) - np.asarray(rb, dtype=np.float64)) * math.log(10) / 400)


def fit_bradley_terry(
    comparisons: Sequence[tuple[int, int]], num_items: int | None = None, *, prior_strength: float = 0.0
) -> np.ndarray:
    """Maximum-likelihood Bradley–Terry rewards: (num_items,), centred to mean 0.

    comparisons: (loser, winner) index pairs, i.e. y₁ ≺ y₂ with p = σ(r₂ − r₁).
    prior_strength: λ ≥ 0 of a Gaussian prior −λ/2·‖r‖² (MAP); with λ = 0 the MLE exists only if
        the graph loser → winner is strongly connected (Zermelo 1929; Ford 1957) — every item
        both wins and loses along some chain — else a ValueError says so.
    The log-likelihood Σ log σ(r_w − r_l) is concave; it is maximised with L-BFGS on its exact
    gradient. At the optimum (λ = 0) each item's expected wins equal its observed wins.
    O(M) per iteration for M comparisons.
    """
    pairs = np.asarray(comparisons, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        raise ValueError("no comparisons given")
    size = int(pairs.max()) + 1 if num_items is None else int(num_items)
    if pairs.min() < 0 or pairs.max() >= size:
        raise ValueError(f"item indices must lie in [0, {size})")
    if np.any(pairs[:, 0] == pairs[:, 1]):
        raise ValueError("an item cannot be compared with itself")
    if prior_strength < 0:
        raise ValueError(f"prior_strength must be >= 0, got {prior_strength}")
    losers, winners = pairs[:, 0], pairs[:, 1]
    if prior_strength == 0 and size > 1:
        graph = coo_matrix((np.ones(len(pairs)), (losers, winners)), shape=(size, size))
        count, _ = connected_components(graph, directed=True, connection="strong")
        if count > 1:
            raise ValueError(
                "the maximum-likelihood rewards diverge: some items never lose (or never win) against "
                "the rest (the comparison graph is not strongly connected); pass prior_strength > 0"
            )

    def objective(rewards: np.ndarray) -> tuple[float, np.ndarray]:
        margin = rewards[winners] - rewards[losers]  # (M,)
        loss = -np.sum(log_expit(margin)) + 0.5 * prior_strength * rewards @ rewards
        push = expit(-margin)  # d(−log σ(m))/dm = −σ(−m)
        gradient = np.bincount(losers, push, size) - np.bincount(winners, push, size) + prior_strength * rewards
        return float(loss), gradient

    options = {"gtol": 1e-10, "maxiter": 10_000}
    result = minimize(objective, np.zeros(size), jac=True, method="L-BFGS-B", options=options)
    return result.x - result.x.mean()


def calibrate_reward(rewards, base_rewards, *, ties: str = "cdf") -> np.ndarray:
    """InfAlign's calibrated reward: the CDF of the reward under base-policy samples.

    rewards: (M,) rewards of responses to one prompt; base_rewards: (S,) rewards of S samples from
    the base policy for the same prompt. Returns (M,) values in [0, 1]:
        ties="cdf":  C(y) = #{s : r_s ≤ r(y)} / S        (the empirical CDF)
        ties="half": C(y) = #{s : r_s < r(y)} / S + ½ #{s : r_s = r(y)} / S   (mid-rank; equals
                     the win rate of y against the base policy, the two agree without ties).
    O((M + S) log S).
    """
    rewards = np.atleast_1d(np.asarray(rewards, dtype=np.float64))
    base = np.sort(np.asarray(base_rewards, dtype=np.float64).ravel())
    if base.size == 0:
        raise ValueError("need at least one base-policy reward to calibrate against")
    at_most = np.searchsorted(base, rewards, side="right")
    if ties == "cdf":
        return at_most / base.size
    if ties == "half":
        below = np.searchsorted(base, rewards, side="left")
        return (below + at_most) / (2 * base.size)
    raise ValueError(f"ties must be 'cdf' or 'half', got {ties!r}")


def best_of_n_transform(calibrated, t: float):
    """Φ_t(u) = exp(t·u), t > 0: InfAlign's transformation of the calibrated reward for best-of-N."""
    if not t > 0:
        raise ValueError(f"t must be > 0, got {t}")
    return np.exp(t * np.asarray(calibrated, dtype=np.float64))


def worst_of_n_transform(calibrated, t: float):
    """Φ_t(u) = −exp(−t·u), t > 0: InfAlign's transformation for best-of-N jailbreaking
    (worst-of-N: the response with the lowest reward is the one that counts)."""
    if not t > 0:
        raise ValueError(f"t must be > 0, got {t}")
    return -np.exp(-t * np.asarray(calibrated, dtype=np.float64))
