"""Curves that predict past the largest n: a power law fitted to each (model, strategy)'s
accuracy, and to each model's coverage (pass@k, the `ORACLE` rows), against n, the samples per
problem. Repeated-sampling studies (Brown et al. 2024, "Large Language Monkeys") find coverage
follows

    −log y(k) ≈ a · k^(−b),   i.e.   log(−log y) = log a − b · log k,

a straight line in (log k, log(−log y)): a and b are its least-squares intercept and slope,
O(K) for K values of n. y must be in (0, 1): a value of 0 or 1 has no logarithm there and is
left out of the fit (named in the reason when too few remain). Three n values at least are
needed: two always fit a line exactly and say nothing about the law.

Each fit reports its error in the metric's own units: the RMSE of exp(−a·k^(−b)) against the
fitted points, and the leave-last-out error, the prediction at the largest n of the law refitted
without it, minus the measured value — how far the law's extrapolation was off one step out,
the honest guide to trusting its predictions further out. Predicted points (`CurvePoint.predicted`)
sit at 2 and 4 times the largest n, their FLOPs extrapolated by a least-squares line in n over
the measured points (sampling cost grows by the same amount per sample; the prompt is paid
once); they carry no interval and never enter paired comparisons. Only a trusted fit predicts:
one whose leave-last-out error is within ±`TRUSTED_ERROR` (a law that missed its own last
measured point by more — a curve that jumps, such as a cascade that escalates nothing at n = 1
and nearly everything at n = 4 — cannot place points two steps further out); the others are
reported with their errors, marked "too far off to predict".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from metagen.decoding.cost import Cost
from metagen.eval.points import ORACLE, CurvePoint

MINIMUM_NS = 3
FACTORS = (2, 4)  # predicted points at these multiples of the largest n
TRUSTED_ERROR = 0.05  # largest |leave-last-out error| of a fit that predicts past the largest n


@dataclass(frozen=True)
class ScalingFit:
    """The law fitted to one curve: metric "accuracy" (a configuration) or "coverage" (pass@k);
    ns: the n values fitted (ascending); a, b: the law's parameters; rmse and leave_last_out:
    its errors (module docstring); reason: why there is no fit (then a, b and the errors are None);
    task: the points' task (`CurvePoint.task`)."""

    model: str
    strategy: str
    metric: str
    ns: tuple[int, ...]
    a: float | None = None
    b: float | None = None
    rmse: float | None = None
    leave_last_out: float | None = None
    reason: str | None = None
    task: str | None = None

    def predict(self, n: float) -> float:
        """y(n) = exp(−a · n^(−b))."""
        if self.a is None:
            raise ValueError(f"no fit for {self.model} {self.strategy}: {self.reason}")
        return math.exp(-self.a * n ** -self.b)

    @property
    def trusted(self) -> bool:
        """Whether the law may place points past the largest n: fitted, and its leave-last-out
        error within ±`TRUSTED_ERROR`."""
        return self.leave_last_out is not None and abs(self.leave_last_out) <= TRUSTED_ERROR

    def to_dict(self) -> dict:
        return {"model": self.model, "strategy": self.strategy, "metric": self.metric, "n": list(self.ns),
                "a": self.a, "b": self.b, "rmse": self.rmse, "leave_last_out_error": self.leave_last_out,
                "trusted": self.trusted, "reason": self.reason,
                **({} if self.task is None else {"task": self.task})}


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys); needs two distinct xs. O(K)."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def fit_power_law(ns: Sequence[int], values: Sequence[float], model: str = "", strategy: str = "",
                  metric: str = "accuracy", task: str | None = None) -> ScalingFit:
    """Fit −log y ≈ a·n^(−b) to (ns, values) by least squares in log space (module docstring).
    ValueError for an n < 1, a repeated n, or a value outside [0, 1]; a ScalingFit with a reason
    (never an error) when fewer than 3 usable n values remain."""
    if len(ns) != len(values):
        raise ValueError(f"ns has {len(ns)} values and values {len(values)}: need one value per n")
    for n, y in zip(ns, values):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} is out of range: must be an integer >= 1")
        if not (isinstance(y, (int, float)) and 0.0 <= y <= 1.0):
            raise ValueError(f"value {y!r} at n={n} is out of range: must be in [0, 1]")
    if len(set(ns)) != len(ns):
        raise ValueError(f"ns={list(ns)} repeats a value: one value per n")
    pairs = sorted(zip(ns, values))
    usable = [(n, y) for n, y in pairs if 0.0 < y < 1.0]
    order = tuple(n for n, _ in pairs)
    if len(pairs) < MINIMUM_NS:
        return ScalingFit(model, strategy, metric, order, task=task,
                          reason=f"needs {MINIMUM_NS} n values or more, has {len(pairs)}")
    if len(usable) < MINIMUM_NS:
        edges = ", ".join(f"n={n} ({metric} {y:g})" for n, y in pairs if not 0.0 < y < 1.0)
        return ScalingFit(model, strategy, metric, order, task=task,
                          reason=f"needs {MINIMUM_NS} n values or more with {metric} strictly between 0 and 1, "
                                 f"has {len(usable)} (left out: {edges})")
    fit = _fit(usable, model, strategy, metric)
    held = _fit(usable[:-1], model, strategy, metric)
    last_n, last_y = usable[-1]
    rmse = math.sqrt(sum((fit.predict(n) - y) ** 2 for n, y in usable) / len(usable))
    return ScalingFit(model, strategy, metric, tuple(n for n, _ in usable), fit.a, fit.b, rmse,
                      held.predict(last_n) - last_y, task=task)


def _fit(usable: list[tuple[int, float]], model: str, strategy: str, metric: str) -> ScalingFit:
    intercept, slope = _line([math.log(n) for n, _ in usable], [math.log(-math.log(y)) for _, y in usable])
    return ScalingFit(model, strategy, metric, tuple(n for n, _ in usable), math.exp(intercept), -slope)


def fit_curves(points: Sequence[CurvePoint]) -> list[ScalingFit]:
    """One fit per (model, strategy) — and task, when the points hold several — among the measured
    `points`, in order of first appearance: of coverage for the `ORACLE` rows, of accuracy
    otherwise. O(P)."""
    curves: dict[tuple, list[CurvePoint]] = {}
    for point in points:
        if not point.predicted:
            curves.setdefault((point.model, point.strategy, point.task), []).append(point)
    return [fit_power_law([p.n for p in curve], [p.accuracy for p in curve], model, strategy,
                          "coverage" if strategy == ORACLE else "accuracy", task)
            for (model, strategy, task), curve in curves.items()]


def predicted_points(fits: Sequence[ScalingFit], points: Sequence[CurvePoint],
                     factors: Sequence[int] = FACTORS) -> list[CurvePoint]:
    """The configurations' points at factor × the largest n, read off each trusted accuracy fit
    (`CurvePoint.predicted`), FLOPs from a least-squares line in n over the curve's measured
    points; none for a curve without a trusted fit, with a FLOPs unknown, or whose line does not
    grow."""
    predicted = []
    for fit in fits:
        if not fit.trusted or fit.metric != "accuracy":
            continue
        curve = [p for p in points if (p.model, p.strategy, p.task) == (fit.model, fit.strategy, fit.task)
                 and not p.predicted]
        if any(p.cost.flops is None for p in curve):
            continue
        intercept, slope = _line([p.n for p in curve], [p.cost.flops for p in curve])
        if slope <= 0:
            continue
        largest = max(p.n for p in curve)
        template = next(p for p in curve if p.n == largest)
        for factor in factors:
            n = largest * factor
            predicted.append(CurvePoint(fit.strategy, n, fit.predict(n), float("nan"), template.problems,
                                        Cost(flops=intercept + slope * n), None, fit.model, chat=template.chat,
                                        task=template.task, predicted=True))
    return predicted


def format_fits(fits: Sequence[ScalingFit], markdown: bool = False) -> str:
    """The text of the fits: one line per curve, its a, b and errors, or why it has none
    (Markdown: a list)."""
    lines = ["scaling fits, -log y = a·n^(-b) (y: accuracy, or coverage for pass@k):" + "\n" * markdown]
    mark = "- " if markdown else "  "
    for fit in fits:
        name = " ".join(part for part in (fit.model, fit.strategy) if part)
        if fit.a is None:
            lines.append(f"{mark}{name} {fit.metric}: no fit, {fit.reason}")
        else:
            distrust = "" if fit.trusted else f"; too far off to predict (leave-last-out error beyond ±{TRUSTED_ERROR:g})"
            lines.append(f"{mark}{name} {fit.metric}: a={fit.a:.3g} b={fit.b:.3g} over n={','.join(map(str, fit.ns))}; "
                         f"RMSE {fit.rmse:.3f}, leave-last-out error {fit.leave_last_out:+.3f}{distrust}")
    return "\n".join(lines)
