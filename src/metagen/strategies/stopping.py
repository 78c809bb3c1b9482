"""When to stop sampling a problem: the posterior probability that the leading answer is the
majority (Aggarwal et al. 2023, "Let's Sample Step by Step: Adaptive-Consistency").

The answers drawn so far fall in classes with counts v_1 ≥ v_2 ≥ … ≥ v_K (from any grouping:
exact or math-aware answer matching, test-output clusters of programs). Their probabilities p
under the model get the posterior Dirichlet(v + 1) (a uniform prior). Two rules:

- "beta": only the top two, p_1 / (p_1 + p_2) ~ Beta(v_1 + 1, v_2 + 1) (the Dirichlet's
  aggregation property, so it is exact for P(p_1 > p_2)):

      P(p_1 > p_2 | v) = P(Beta(a, b) > 1/2) = P(Binomial(a + b − 1, 1/2) ≤ a − 1)
                       = 2^−m · Σ_{j=0}^{v_1} C(m, j),   a = v_1 + 1, b = v_2 + 1, m = v_1 + v_2 + 1

  (a Beta(a, b) variable with integer a, b is the a-th order statistic of a + b − 1 uniforms,
  so it exceeds 1/2 when at most a − 1 of them fall below 1/2). Exact in integers, O(v_1).
- "dirichlet": P(p_1 > max_{j>1} p_j | v) under the whole Dirichlet(v + 1), by Monte Carlo:
  S draws of independent Gamma(v_j + 1) variables (their normalization is Dirichlet, and the
  argmax does not need it), the share of draws whose largest is class 1. O(S·K); standard
  error ≤ 1/(2√S) (0.008 at the default S = 4096). Seeded: the probability is a function of
  the counts alone.

Fewer than two classes are padded with zero counts: one answer seen v times is weighed
against an unseen rival, P = 1 − 2^−(v+1) under both rules (4 agreeing answers give 0.969).
Sampling stops when the probability reaches the threshold (0.95 in the paper).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

RULES = ("beta", "dirichlet")


def _sorted_counts(counts: Sequence[float], integers: bool) -> list:
    """The counts in decreasing order, padded with zeros to at least two; ValueError naming
    `counts` for a negative (or, when `integers`, non-integral) count."""
    checked = []
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, (int, float)) or count < 0 or not math.isfinite(count):
            raise ValueError(f"counts={list(counts)!r} is out of range: each count must be a finite number >= 0")
        if integers and count != int(count):
            raise ValueError(f"counts={list(counts)!r} must be whole numbers for rule 'beta' "
                             "(weighted votes: use rule 'dirichlet')")
        checked.append(int(count) if integers else float(count))
    checked.sort(reverse=True)
    return checked + [0] * (2 - len(checked))


def beta_majority_probability(counts: Sequence[int]) -> float:
    """P(p_1 > p_2 | counts) with p_1 / (p_1 + p_2) ~ Beta(v_1 + 1, v_2 + 1), exactly (module
    docstring); counts: answer counts in any order (whole numbers)."""
    top, second = _sorted_counts(counts, integers=True)[:2]
    m = top + second + 1
    return sum(math.comb(m, j) for j in range(top + 1)) / 2**m  # int / int: correctly rounded


def dirichlet_majority_probability(counts: Sequence[float], rng, samples: int = 4096) -> float:
    """P(p_1 > max_{j>1} p_j | counts) under Dirichlet(counts + 1), estimated from `samples`
    draws of `rng` (a `numpy.random.Generator`). counts may be weighted (real, >= 0)."""
    import numpy as np

    if samples < 1:
        raise ValueError(f"samples={samples} is out of range: must be >= 1")
    alpha = np.asarray(_sorted_counts(counts, integers=False)) + 1.0  # (K,), the leader first
    draws = rng.gamma(alpha, size=(samples, alpha.shape[0]))  # (S, K): Dirichlet up to normalization
    return float(np.mean(np.argmax(draws, axis=1) == 0))


def majority_probability(counts: Sequence[float], rule: str = "beta", *, samples: int = 4096, seed: int = 0) -> float:
    """The posterior probability under `rule` ("beta" or "dirichlet") that the most counted
    answer is the majority; "dirichlet" draws from a fresh `numpy.random.default_rng(seed)`,
    so the value depends on the counts, samples and seed only."""
    if rule == "beta":
        return beta_majority_probability(counts)
    if rule == "dirichlet":
        import numpy as np

        return dirichlet_majority_probability(counts, np.random.default_rng(seed), samples)
    raise ValueError(f"rule={rule!r} is not a stopping rule; choose from {', '.join(RULES)}")


def check_threshold(threshold: float) -> None:
    if isinstance(threshold, bool) or not 0 < threshold < 1:
        raise ValueError(f"threshold={threshold} is out of range: must be in (0, 1)")


def should_stop(counts: Sequence[float], threshold: float = 0.95, rule: str = "beta", *, samples: int = 4096,
                seed: int = 0) -> bool:
    """Stop sampling when `majority_probability(counts, rule)` >= threshold, in (0, 1) (the
    posterior reaches 1 only by rounding or, for "dirichlet", when every draw agrees)."""
    check_threshold(threshold)
    return majority_probability(counts, rule, samples=samples, seed=seed) >= threshold
