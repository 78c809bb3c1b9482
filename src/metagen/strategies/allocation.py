"""Compute-optimal allocation of a sample budget across problems (Snell et al. 2024).

A first round of k samples per problem estimates how much more samples would help it; the rest
of a total budget B goes where the expected accuracy gain is largest:

    maximise Σ_i f_i(n_i)   subject to   Σ_i n_i <= B,   k <= n_i <= n_max_i

f_i(n) is problem i's expected accuracy with n samples under an estimated success model:

- majority vote: for known answer probabilities p, taken as calibrated (answer j is correct
  with probability p_j), f(n) = Σ_j p_j · P(answer j has the most of n draws from p), ties
  split uniformly (`vote_accuracy_curve`): p = (0.6, 0.4) goes from f(1) = 0.52 to 0.6 as n
  grows, an even split stays at 1/K. The p are not known: `vote_curve_from_counts` averages f
  over their Dirichlet posterior given the first-round counts, Dir(c + α) with one more class
  for answers not seen yet, so one agreeing sample is not certainty and a 2–2 tie, which more
  samples break, is not hopeless.
- verifier (`verifier_accuracy_curve`): ŝ, the mean first-round verifier score in [0, 1], is
  read as each sample's probability of being correct, and a verifier that recognises a correct
  sample picks it:  f(n) = 1 − (1 − ŝ)^n (optimistic; concave).

`allocate` is greedy on marginal gains: it repeatedly gives Δ samples to the problem with the
largest average gain (f(n + Δ) − f(n)) / Δ over Δ >= 1 (the slope to its upper concave envelope,
so a flat step such as a two-answer vote at an even n does not stall it). For concave f it is
optimal (the exchange argument of separable concave resource allocation); samples no problem
gains from are left unspent. O(B·log P + steps·n_max) with a lazy heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def vote_accuracy_curve(probabilities: Sequence[float], n_max: int, rng, samples: int = 4096) -> list[float]:
    """f(n) for n = 0..n_max of a majority vote over n draws from `probabilities` (the answers'
    estimated probabilities, summing to 1), by Monte Carlo with `rng` (a numpy Generator): S
    sequences of n_max draws, the running counts scored at every n with one tie-break jitter per
    sequence and answer (common random numbers: f(n + 1) − f(n) has little noise). f(0) = 0.
    Exact for one answer (1) and for equal probabilities (1/K). O(n_max·S·K) time, O(S·K) memory."""
    import numpy as np

    p = np.asarray(probabilities, dtype=float)  # (K,)
    if p.ndim != 1 or p.size == 0 or (p < 0).any() or abs(p.sum() - 1) > 1e-6:
        raise ValueError(f"probabilities={list(probabilities)!r} must be >= 0 and sum to 1")
    if n_max < 0:
        raise ValueError(f"n_max={n_max} is out of range: must be >= 0")
    draws = rng.choice(p.size, size=(samples, n_max), p=p)  # (S, n_max)
    jitter = rng.random((samples, p.size)) * 0.5  # (S, K): uniform tie-break, below one vote
    counts = np.zeros((samples, p.size))  # (S, K)
    rows = np.arange(samples)
    curve = [0.0]
    for step in range(n_max):
        counts[rows, draws[:, step]] += 1
        curve.append(float(p[np.argmax(counts + jitter, axis=1)].mean()))
    return curve


PRIOR = 0.5  # α of the Dirichlet posterior (Jeffreys' prior: half a pseudo-sample per answer)


def vote_curve_from_counts(counts: Sequence[float], n_max: int, rng, samples: int = 4096,
                           alpha: float = PRIOR) -> list[float]:
    """f(n) for n = 0..n_max of a majority vote, averaged over the posterior of the answers'
    probabilities given the first-round counts c_1..c_K (samples without an answer left out):

        p ~ Dirichlet(c_1 + α, ..., c_K + α, α),   f(n) = E_p[ Σ_j p_j · P(j has the most of n draws | p) ]

    The last class stands for the answers no sample gave yet (taken as one answer, so it can win
    a vote; an optimistic simplification). Why a posterior and not the plug-in p̂ = c / Σc: a
    handful of samples says little. The plug-in reads one sample as certainty (p̂ = 1: nothing
    to gain, so a first round of 1 allocates nothing) and an even split as hopeless (f ≡ 1/K),
    while under the posterior a 2–2 split is p ~ Dirichlet(2.5, 2.5, 0.5), rarely exactly
    even: more samples find its leader, so it gains about as much as a 3–1 lead (f(16) − f(4)
    ≈ 0.044 each, four agreeing samples 0.018). α = 1/2 (Jeffreys) adds half a pseudo-sample
    per answer: weak enough that four agreeing samples read as nearly certain (E[p] = 0.9).

    Monte Carlo with `rng` (a numpy Generator): S draws of p, each with one sequence of n_max
    answers drawn from it, scored at every n with one tie-break jitter per sequence and answer
    (common random numbers). No answer at all: f ≡ 0. O(n_max·S·K) time and memory."""
    import numpy as np

    if not alpha > 0:
        raise ValueError(f"alpha={alpha} is out of range: must be > 0")
    if n_max < 0:
        raise ValueError(f"n_max={n_max} is out of range: must be >= 0")
    total = float(sum(counts))
    if total <= 0:
        return [0.0] * (n_max + 1)
    concentration = [float(c) + alpha for c in counts] + [alpha]  # (K + 1,)
    p = rng.dirichlet(concentration, size=samples)  # (S, K + 1)
    edges = np.cumsum(p, axis=1)[:, :-1]  # (S, K): inverse-CDF sampling per sequence
    uniform = rng.random((samples, n_max))  # (S, n_max)
    draws = (uniform[:, :, None] >= edges[:, None, :]).sum(axis=2)  # (S, n_max) answers in 0..K
    jitter = rng.random((samples, p.shape[1])) * 0.5  # (S, K + 1): uniform tie-break, below one vote
    counts_so_far = np.zeros_like(p)  # (S, K + 1)
    rows = np.arange(samples)
    curve = [0.0]
    for step in range(n_max):
        counts_so_far[rows, draws[:, step]] += 1
        curve.append(float(p[rows, np.argmax(counts_so_far + jitter, axis=1)].mean()))
    return curve


def verifier_accuracy_curve(success: float, n_max: int) -> list[float]:
    """f(n) = 1 − (1 − ŝ)^n for n = 0..n_max, ŝ in [0, 1] (module docstring)."""
    if not 0 <= success <= 1:
        raise ValueError(f"success={success} is out of range: must be in [0, 1]")
    return [1 - (1 - success) ** n for n in range(n_max + 1)]


def _best_step(curve: Sequence[float], n: int, room: int) -> tuple[float, int]:
    """(largest average gain, its Δ) over Δ in 1..room; (0, 0) when no Δ gains."""
    best = (0.0, 0)
    for step in range(1, room + 1):
        gain = (curve[n + step] - curve[n]) / step
        if gain > best[0] + 1e-12:
            best = (gain, step)
    return best


def allocate(curves: Sequence[Sequence[float]], start: int, budget: int) -> list[int]:
    """Samples per problem maximising Σ_i curves[i][n_i] (module docstring). curves[i][n]:
    problem i's expected accuracy with n samples, n = 0..n_max_i (n_max_i = len − 1); start: the
    first round every problem already drew (k <= n_max_i); budget: total samples B, first round
    included (B >= k·P). Ties go to the problem listed first."""
    if start < 0 or any(len(curve) - 1 < start for curve in curves):
        raise ValueError(f"start={start} is out of range: must be in [0, n_max] of every curve")
    if budget < start * len(curves):
        raise ValueError(f"budget={budget} is out of range: the first round alone takes {start * len(curves)} "
                         f"({start} per problem for {len(curves)} problems)")
    allocation = [start] * len(curves)
    left = budget - start * len(curves)
    heap = []
    for i, curve in enumerate(curves):
        gain, step = _best_step(curve, start, min(left, len(curve) - 1 - start))
        if step:
            heap.append((-gain, i, step))
    heapq.heapify(heap)
    while heap and left > 0:
        _, i, step = heapq.heappop(heap)
        if step > left:  # the step no longer fits: its best fitting one gains no more, re-queue it
            gain, step = _best_step(curves[i], allocation[i], min(left, len(curves[i]) - 1 - allocation[i]))
            if step:
                heapq.heappush(heap, (-gain, i, step))
            continue
        allocation[i] += step
        left -= step
        gain, step = _best_step(curves[i], allocation[i], min(left, len(curves[i]) - 1 - allocation[i]))
        if step:
            heapq.heappush(heap, (-gain, i, step))
    return allocation
