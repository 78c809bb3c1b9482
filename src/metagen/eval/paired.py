"""Paired comparison at one budget: is the best configuration really better than the runner-up,
and how often would each affordable configuration come out on top on another draw of problems?

Both configurations were scored on the same problems, so the comparison resamples problems, not
each configuration on its own (a paired bootstrap, Efron & Tibshirani 1993, ch. 16): one
resample r draws P problem indices with replacement and every configuration k is scored on
that same draw,

    x*_{k,r} = (1/P) Σ_p w_{r,p} · s_{k,p},    w_r ~ Multinomial(P, 1/P, ..., 1/P)

with s_{k,p} configuration k's score on problem p. The difference best − runner-up is
d*_r = x*_{best,r} − x*_{runner,r}; its 95% percentile interval is read as in
`points.bootstrap_interval`, and when it contains 0 the budget's choice is *undecided*: the
problems do not separate the two. The variance of a paired difference drops by the covariance
of the two configurations' scores (both fail the same hard problems), so it decides cases that
two overlapping unpaired intervals leave open.

p_best(k) is the share of resamples where k has the highest mean among the configurations
affordable at the budget, ties split evenly (two configurations equal in a resample get half a
win each), so Σ_k p_best(k) = 1.

Configurations are compared only on the same problem set: one scored on other problems (another
task, a `--limit` changed between runs) or without per-problem scores (a row of an older
summary.json, a predicted point) is skipped, and the reason is kept in the output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.eval.points import BOOTSTRAP_RESAMPLES, LEVEL

if TYPE_CHECKING:
    import numpy

    from metagen.eval.points import CurvePoint

TIE = 1e-12  # resample means closer than this are a tie


@dataclass(frozen=True)
class Paired:
    """The paired statistics of one budget's choice. difference: accuracy(best) − accuracy(runner-up)
    on their shared problems, with its percentile interval (None when not computed; `reason` says
    why); p_best: (point, share of resamples it is the most accurate) over the affordable
    configurations compared, summing to 1; skipped: (point, why it was left out of p_best)."""

    difference: float | None
    interval: tuple[float, float] | None
    p_best: tuple[tuple[CurvePoint, float], ...]
    skipped: tuple[tuple[CurvePoint, str], ...]
    reason: str | None = None

    @property
    def undecided(self) -> bool | None:
        """Whether the paired interval contains 0 (None: no interval)."""
        return None if self.interval is None else self.interval[0] <= 0.0 <= self.interval[1]

    def to_dict(self) -> dict:
        def name(point: CurvePoint) -> dict:
            return {"model": point.model, "strategy": point.strategy, "n": point.n}

        return {"difference": self.difference, "interval": None if self.interval is None else list(self.interval),
                "undecided": self.undecided, "reason": self.reason,
                "p_best": [{**name(point), "p_best": share} for point, share in self.p_best],
                "skipped": [{**name(point), "reason": why} for point, why in self.skipped]}


def resample_means(scores: "numpy.ndarray", rng: "numpy.random.Generator",
                   resamples: int = BOOTSTRAP_RESAMPLES) -> "numpy.ndarray":
    """x*: (R, K) means of K configurations over R paired resamples of the P problems;
    scores: (K, P). One multinomial count vector per resample, shared by every configuration.
    Time O(R·P·K), memory O(K·R + 2^20) (counts drawn in chunks of about 2^20)."""
    import numpy as np

    count = scores.shape[1]
    means = np.empty((resamples, scores.shape[0]))  # (R, K)
    chunk = max(1, (1 << 20) // count)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        weights = rng.multinomial(count, np.full(count, 1.0 / count), size=stop - start)  # (chunk, P)
        means[start:stop] = weights @ scores.T / count
    return means


def percentile_interval(values: "numpy.ndarray", level: float = LEVEL) -> tuple[float, float]:
    """The (α/2, 1 − α/2) empirical quantiles of `values` (R,), α = 1 − level, each the smallest
    value whose empirical CDF reaches it (sorted(values)[ceil(R·q) − 1]), as `bootstrap_interval`."""
    ordered = sorted(float(value) for value in values)
    alpha = 1.0 - level

    def quantile(q: float) -> float:
        return ordered[max(math.ceil(len(ordered) * q - 1e-9), 1) - 1]

    return quantile(alpha / 2), quantile(1.0 - alpha / 2)


def win_shares(means: "numpy.ndarray") -> list[float]:
    """p_best per configuration from (R, K) resample means: the share of resamples where it has
    the highest mean, a tie of t configurations giving each 1/t. Σ = 1. O(R·K)."""
    import numpy as np

    top = means.max(axis=1, keepdims=True)  # (R, 1)
    winners = (means >= top - TIE).astype(np.float64)  # (R, K)
    return [float(share) for share in (winners / winners.sum(axis=1, keepdims=True)).mean(axis=0)]


def compare(best: CurvePoint | None, runner_up: CurvePoint | None, affordable: Sequence[CurvePoint], seed: int = 0,
            resamples: int = BOOTSTRAP_RESAMPLES, level: float = LEVEL) -> Paired | None:
    """The paired statistics of one budget's `best` and `runner_up` (as `frontier.per_budget`
    picks them) over `affordable`, the configurations whose FLOPs fit it (the best among them).
    None when nothing fits. The rng is `numpy.random.default_rng(seed)`: the same seed, the
    same numbers. O(R·P·K) for K configurations compared."""
    import numpy as np

    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r} is out of range: must be an integer >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} is out of range: must be in (0, 1)")
    if best is None:
        return None
    if best.per_problem is None or not best.per_problem:
        why = "predicted, not measured" if best.predicted else "no per-problem scores stored"
        return Paired(None, None, (), (), f"best has {why}: nothing to resample")
    problems = list(best.per_problem)
    compared, skipped = [best], []
    for point in affordable:
        if point is best:
            continue
        why = _mismatch(point, best)
        if why is None:
            compared.append(point)
        else:
            skipped.append((point, why))
    scores = np.array([[point.per_problem[problem] for problem in problems] for point in compared])  # (K, P)
    means = resample_means(scores, np.random.default_rng(seed), resamples)  # (R, K), best in column 0
    shares = tuple(zip(compared, win_shares(means)))
    if runner_up is None:
        return Paired(None, None, shares, tuple(skipped), "no runner-up fits this budget")
    index = next((i for i, point in enumerate(compared) if point is runner_up), None)
    if index is None:
        return Paired(None, None, shares, tuple(skipped), f"runner-up {_mismatch(runner_up, best)}: not compared")
    difference = float(scores[0].mean() - scores[index].mean())
    return Paired(difference, percentile_interval(means[:, 0] - means[:, index], level), shares, tuple(skipped))


def _mismatch(point: CurvePoint, best: CurvePoint) -> str | None:
    """Why `point` cannot be paired with `best` (None: it can)."""
    if point.per_problem is None or not point.per_problem:
        return "is predicted, not measured" if point.predicted else "has no per-problem scores stored"
    if set(point.per_problem) != set(best.per_problem):
        shared = len(set(point.per_problem) & set(best.per_problem))
        return (f"was run on other problems ({shared} of its {len(point.per_problem)} shared with the best's "
                f"{len(best.per_problem)})")
    return None
