"""Inference scaling: the accuracy that (weighted) majority voting converges to.

Voting limit (Wu et al. 2024, "Inference scaling laws", Theorem 2): with
N samples (z, a) ∼ g(·|x) and a reward v(x, z, a), weighted voting returns
argmax_a Σᵢ v(x, zᵢ, aᵢ)·1{aᵢ = a}. As N → ∞ the vote is decided by the marginal masses, so the
accuracy on M problems converges to

    1/M Σᵢ 1[a*ᵢ = argmax_a Σ_z v(x, z, a) g(z, a | x)]

(majority voting: v ≡ 1, the mass is P_g[a]). Tie rule: when several answers share the top mass,
the vote among them stays a coin flip for every N, and the correct answer is credited 1/|tied|.
For a two-way tie that is the exact limit (the vote difference is a mean-zero sum, asymptotically
symmetric) and likewise for majority voting with any number of tied answers (their counts are
exchangeable); for weighted voting with three or more tied answers the true limit is a Gaussian
orthant probability, and 1/|tied| is the convention used here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def answer_masses(p, answers: Sequence[Hashable], weights=None) -> dict[Hashable, float]:
    """Σ_z v(z)·g(z) for every answer reachable under g (p > 0). p, weights: (K,); answers: K labels."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or len(answers) != p.size or p.size == 0:
        raise ValueError(f"p (K,) and answers (K labels) must have one length, got {p.shape} and {len(answers)}")
    if np.any(p < 0) or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError("p must be a probability vector over the K solution paths")
    v = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    if v.shape != p.shape or np.any(v < 0) or not np.all(np.isfinite(v)):
        raise ValueError("weights must be finite, non-negative and of shape (K,)")
    masses: dict[Hashable, float] = {}
    for probability, answer, weight in zip(p.tolist(), answers, v.tolist()):
        if probability > 0:
            masses[answer] = masses.get(answer, 0.0) + weight * probability
    return masses


def voting_limit(p, answers: Sequence[Hashable], correct: Hashable, weights=None, *, rtol: float = 1e-12) -> float:
    """The N → ∞ probability that (weighted) majority voting over N samples answers `correct`.

    p: (K,) probabilities g(z, a | x) of K solution paths; answers: the answer of each path;
    weights: (K,) rewards v(x, z, a) ≥ 0 for weighted voting, None for majority voting.
    Returns 1 if `correct` has the strictly largest mass, 1/|tied| if it ties for the largest
    (masses within rtol of the top), else 0. Average over problems for the accuracy limit. O(K).
    """
    masses = answer_masses(p, answers, weights)
    top = max(masses.values())
    if top <= 0:
        raise ValueError("every reachable answer has zero weighted mass: the vote is undefined")
    tied = [answer for answer, mass in masses.items() if mass >= top * (1 - rtol)]
    return 1.0 / len(tied) if correct in tied else 0.0
