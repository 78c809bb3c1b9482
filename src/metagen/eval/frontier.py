"""The compute-optimal frontier and the answer per budget: which (model, strategy, n) to use for
a compute budget C (Wu et al. 2024, "Inference scaling laws"):

    argmin_{model, strategy, n}  error(model, strategy, n)   s.t.  cost(model, strategy, n) ≤ C

with the cost in FLOPs per problem (the mean over the evaluated problems, `Cost.flops`).

Every function takes the evaluation's result rows, `CurvePoint`s (`points.py`; rows read back
from a `--json` output or summary.json through `CurvePoint.from_dict`), each identified by
(model, strategy, n). A point whose FLOPs are unknown (None: a remote model without a parameter
count) cannot be placed on the cost axis: it is never treated as free (0) nor as dearest, but
returned in `unplaced`, so the caller can say which configurations were left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.tables import Table, with_notes

if TYPE_CHECKING:
    from metagen.eval.points import CurvePoint

def intervals_overlap(a: CurvePoint, b: CurvePoint) -> bool | None:
    """Whether the accuracy intervals of `a` and `b` share a point: max(lows) ≤ min(highs);
    None when either has no interval. Overlapping 95% intervals mean the evaluation does not
    separate the two at that level (it is a conservative test, not a significance test)."""
    if a.interval is None or b.interval is None:
        return None
    return max(a.interval[0], b.interval[0]) <= min(a.interval[1], b.interval[1])


@dataclass(frozen=True)
class Frontier:
    """points: on the frontier, by increasing FLOPs (equal points in input order);
    unplaced: the points whose FLOPs are unknown, in input order."""

    points: tuple
    unplaced: tuple


@dataclass(frozen=True)
class Choice:
    """The answer at one budget: the most accurate point whose mean FLOPs fit (ties: the
    cheaper, then the first given), the next one in that order that scores otherwise on some
    problem, and whether their accuracy intervals overlap (None without a runner-up or an
    interval). same: the affordable points that score exactly as the best on every problem (an
    adaptive vote that never stopped early, a strategy that picks as another does), named beside
    it rather than offered as a runner-up no problem separates from it. best None: nothing fits."""

    budget: float
    best: CurvePoint | None
    runner_up: CurvePoint | None
    overlap: bool | None
    same: tuple = ()

    def to_dict(self) -> dict:
        return {"budget_flops": self.budget, "best": None if self.best is None else self.best.to_dict(),
                "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
                "intervals_overlap": self.overlap, "same_as_best": [point.to_dict() for point in self.same]}


@dataclass(frozen=True)
class BudgetTable:
    """choices: one per budget, in the order given; unplaced: points of unknown FLOPs."""

    choices: tuple[Choice, ...]
    unplaced: tuple


def _split(points: Sequence[CurvePoint]) -> tuple[list, list]:
    """(placed, unplaced), after checking every point's accuracy and FLOPs (ValueError naming the point)."""
    placed, unplaced = [], []
    for point in points:
        where = f"point (model={point.model!r}, strategy={point.strategy!r}, n={point.n})"
        if not (isinstance(point.accuracy, (int, float)) and 0.0 <= point.accuracy <= 1.0):
            raise ValueError(f"{where} has accuracy={point.accuracy!r}: must be in [0, 1]")
        flops = point.cost.flops
        if flops is None:
            unplaced.append(point)
        elif not (math.isfinite(flops) and flops >= 0):
            raise ValueError(f"{where} has cost.flops={flops!r}: must be a finite number >= 0, or None (unknown)")
        else:
            placed.append(point)
    return placed, unplaced


def frontier(points: Sequence[CurvePoint]) -> Frontier:
    """The compute-optimal frontier: the points no other point dominates. q dominates p when

        flops(q) ≤ flops(p)  and  accuracy(q) ≥ accuracy(p),  one of them strict

    (as accurate or more for fewer FLOPs, or more accurate for as many). Two points with equal
    FLOPs and accuracy do not dominate each other: both are on it. Points of unknown FLOPs are
    returned in `unplaced`, never compared. Sweep over FLOPs groups in increasing order: a
    group's most accurate points are on the frontier iff they beat every cheaper point.
    O(P log P)."""
    placed, unplaced = _split(points)
    order = sorted(range(len(placed)), key=lambda i: (placed[i].cost.flops, i))
    on, best_cheaper, start = [], -math.inf, 0
    while start < len(order):
        stop = start
        while stop < len(order) and placed[order[stop]].cost.flops == placed[order[start]].cost.flops:
            stop += 1
        group = [placed[i] for i in order[start:stop]]  # equal FLOPs, input order
        top = max(point.accuracy for point in group)
        if top > best_cheaper:
            on.extend(point for point in group if point.accuracy == top)
            best_cheaper = top
        start = stop
    return Frontier(tuple(on), tuple(unplaced))


def per_budget(points: Sequence[CurvePoint], budgets: Sequence[float]) -> BudgetTable:
    """"At budget C use X": for each C, the most accurate point with flops ≤ C (ties broken by
    fewer FLOPs, then input order; it is always on the `frontier`), the runner-up in the same
    order among the points that score otherwise than the best on some problem (those that score
    the same on every problem are the choice's `same`), and whether the two intervals overlap.
    Points of unknown FLOPs are in `unplaced`: they might fit any budget, so the table says they
    were left out. O(P log P + B·P·Q) for Q problems."""
    for budget in budgets:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (math.isfinite(budget)
                                                                                    and budget >= 0):
            raise ValueError(f"budget={budget!r} is out of range: must be a finite number of FLOPs >= 0")
    placed, unplaced = _split(points)
    ranked = [placed[i] for i in sorted(range(len(placed)),
                                        key=lambda i: (-placed[i].accuracy, placed[i].cost.flops, i))]
    choices = []
    for budget in budgets:
        fits = [point for point in ranked if point.cost.flops <= budget]
        best = fits[0] if fits else None
        alike = [same_scores(point, best) for point in fits[1:]]
        same = tuple(point for point, twin in zip(fits[1:], alike) if twin)
        runner_up = next((point for point, twin in zip(fits[1:], alike) if not twin), None)
        overlap = intervals_overlap(best, runner_up) if runner_up is not None else None
        choices.append(Choice(float(budget), best, runner_up, overlap, same))
    return BudgetTable(tuple(choices), tuple(unplaced))


def same_scores(point: CurvePoint, other: CurvePoint) -> bool:
    """Whether both were measured on the same problems and score alike on every one (to 1e-12)."""
    mine, theirs = point.per_problem, other.per_problem
    return bool(mine) and bool(theirs) and mine.keys() == theirs.keys() and all(
        abs(score - theirs[problem]) <= 1e-12 for problem, score in mine.items())


def budget_ladder(points: Sequence[CurvePoint], rungs: int = 8) -> tuple[float, ...]:
    """`rungs` budgets spaced evenly in log FLOPs from the cheapest placed point to the dearest,
    both ends exact (so the dearest point fits the last rung):

        C_i = lo · (hi / lo)^(i / (rungs − 1)),  i = 0..rungs−1,  lo = min flops > 0, hi = max flops

    One rung (hi) when rungs is 1 or all placed points cost the same; () when none is placed.
    Points costing 0 fit every rung. O(P + rungs)."""
    if isinstance(rungs, bool) or not isinstance(rungs, int) or rungs < 1:
        raise ValueError(f"rungs={rungs!r} is out of range: must be an integer >= 1")
    placed, _ = _split(points)
    if not placed:
        return ()
    hi = max(point.cost.flops for point in placed)
    positive = [point.cost.flops for point in placed if point.cost.flops > 0]
    lo = min(positive) if positive else hi
    if rungs == 1 or lo == hi:
        return (float(hi),)
    inner = tuple(lo * (hi / lo) ** (i / (rungs - 1)) for i in range(1, rungs - 1))
    return (float(lo), *inner, float(hi))


def predicted_budgets(points: Sequence[CurvePoint], predicted: Sequence[CurvePoint],
                      rungs: int = 3) -> tuple[float, ...]:
    """Budgets past the dearest measured point, up to the dearest predicted one, evenly in log
    FLOPs: hi · (top / hi)^(i / rungs), i = 1..rungs; () when no predicted point is dearer."""
    placed, _ = _split(points)
    if not placed or not predicted:
        return ()
    hi = max(point.cost.flops for point in placed)
    top = max(point.cost.flops for point in predicted)
    if not top > hi > 0:
        return ()
    return tuple(hi * (top / hi) ** (i / rungs) for i in range(1, rungs + 1))


@dataclass(frozen=True)
class Answer:
    """Everything `compute_optimal` reports: the frontier, the per-budget table with each
    budget's paired statistics (`paired.compare`; None where nothing fits), the scaling fits
    (`scaling_fit.fit_curves`, coverage included), and the table past the largest n, whose
    budgets and choices may be predicted points (`CurvePoint.predicted`)."""

    frontier: Frontier
    table: BudgetTable
    paired: tuple
    fits: tuple
    predicted: BudgetTable


def answer(points: Sequence[CurvePoint], budgets: Sequence[float] | None = None, coverage: Sequence[CurvePoint] = (),
           seed: int = 0, resamples: int | None = None) -> Answer:
    """The `Answer` over the configurations `points` (coverage: the pass@k rows, fitted but never
    chosen); budgets default to `budget_ladder(points)`; seed and resamples (default
    `points.BOOTSTRAP_RESAMPLES`) drive the paired bootstrap. Points marked predicted are left
    out: the fits make their own. p_best at a budget is over the affordable configurations but
    the choice's `same` (copies of the choice would split its wins). O(P log P + budgets · R · P · K)."""
    from metagen.eval.paired import compare
    from metagen.eval.points import BOOTSTRAP_RESAMPLES
    from metagen.eval.scaling_fit import fit_curves, predicted_points

    measured = [point for point in points if not point.predicted]
    table = per_budget(measured, budget_ladder(measured) if budgets is None else budgets)
    placed, _ = _split(measured)
    paired = tuple(compare(choice.best, choice.runner_up,
                           [p for p in placed if p.cost.flops <= choice.budget and not _among(p, choice.same)],
                           seed, BOOTSTRAP_RESAMPLES if resamples is None else resamples)
                   for choice in table.choices)
    fits = tuple(fit_curves([*measured, *coverage]))
    extra = predicted_points(fits, measured)
    predicted = per_budget([*measured, *extra], predicted_budgets(measured, extra))
    return Answer(frontier(measured), table, paired, fits, predicted)


def _among(point: CurvePoint, points: Sequence[CurvePoint]) -> bool:
    return any(point is other for other in points)


def compute_optimal(points: Sequence[CurvePoint], budgets: Sequence[float] | None = None,
                    coverage: Sequence[CurvePoint] = (), seed: int = 0, resamples: int | None = None) -> dict:
    """The JSON of the `answer`: {"frontier": [rows on it], "per_budget": [{"budget_flops",
    "best", "runner_up", "intervals_overlap", "same_as_best", "paired"}], "unplaced": [rows of unknown FLOPs],
    "scaling_fits": [fits], "predicted_per_budget": [{..., "predicted": true}]}, rows as
    `CurvePoint.to_dict` (a predicted row has "predicted": true); "paired" as `Paired.to_dict`."""
    return answer_dict(answer(points, budgets, coverage, seed, resamples))


def answer_dict(result: Answer) -> dict:
    """The JSON of an `Answer` (`compute_optimal`'s form)."""
    return {"frontier": [point.to_dict() for point in result.frontier.points],
            "per_budget": [{**choice.to_dict(), "paired": None if paired is None else paired.to_dict()}
                           for choice, paired in zip(result.table.choices, result.paired)],
            "unplaced": [point.to_dict() for point in result.table.unplaced],
            "scaling_fits": [fit.to_dict() for fit in result.fits],
            "predicted_per_budget": [{**choice.to_dict(), "predicted": True} for choice in result.predicted.choices]}


def describe(point: CurvePoint) -> str:
    """'model strategy n=4' (the model left out when unnamed)."""
    return " ".join(part for part in (point.model, point.strategy, f"n={point.n}") if part)


def format_compute_optimal(points: Sequence[CurvePoint], budgets: Sequence[float] | None = None,
                           coverage: Sequence[CurvePoint] = (), seed: int = 0, resamples: int | None = None,
                           markdown: bool = False) -> str:
    """`format_answer` of the `answer` over `points` (arguments as `answer`'s)."""
    return format_answer(answer(points, budgets, coverage, seed, resamples), points, markdown)


def format_answer(result: Answer, points: Sequence[CurvePoint], markdown: bool = False) -> str:
    """The text (plain, or Markdown with pipe tables) of an `Answer` over `points`: the
    frontier's points by increasing FLOPs, then an "at budget C use X" table (budget in TFLOPs,
    the choice with its accuracy and interval (and the points that score as it does on every
    problem), the runner-up, whether their intervals overlap, the paired difference best −
    runner-up with its interval, "undecided" when it holds 0, and p_best of the choice), then
    the points left out (FLOPs unknown), the scaling fits, the budgets past the largest n (each
    predicted choice marked "*"), and the flag of models given their prompts differently
    (`points.mixed_prompts_note`): a "(raw)" or "(chat)" after each point named, and the note's
    line. One `Answer` formats both ways without a second bootstrap."""
    from metagen.eval.points import mixed_prompts_note
    from metagen.eval.scaling_fit import format_fits

    table = result.table
    mixed = mixed_prompts_note(points)
    star = "\\*" if markdown else "*"  # a bare * would start emphasis in Markdown

    def named(point: CurvePoint) -> str:
        mark = star if point.predicted else ""
        if not mixed or point.chat is None:
            return mark + describe(point)
        return f"{mark}{describe(point)} ({'chat' if point.chat else 'raw'})"

    def shown(point: CurvePoint | None) -> str:
        if point is None:
            return "–"
        interval = "" if point.interval is None else f" [{point.interval[0]:.3f}, {point.interval[1]:.3f}]"
        return f"{named(point)}: {point.accuracy:.3f}{interval}"

    rows, notes = [], []
    for choice, paired in zip(table.choices, result.paired):
        best = shown(choice.best) if choice.best is not None else "nothing fits"
        if choice.same:
            best += "; the same on every problem: " + ", ".join(named(point) for point in choice.same)
        overlap = {True: "yes", False: "no", None: "–"}[choice.overlap]
        difference, chance = "–", "–"
        if paired is not None and paired.interval is not None:
            low, high = paired.interval
            difference = f"{paired.difference:+.3f} [{low:+.3f}, {high:+.3f}]"
            difference += " undecided" if paired.undecided else ""
        elif paired is not None and paired.reason is not None and choice.runner_up is not None:
            notes.append(f"{choice.budget / 1e12:.4g} TFLOPs: no paired difference, {paired.reason}")
        if paired is not None and paired.p_best:
            chance = f"{paired.p_best[0][1]:.2f}"
        for point, why in () if paired is None else paired.skipped:
            notes.append(f"{choice.budget / 1e12:.4g} TFLOPs: {named(point)} left out of p_best, {why}")
        rows.append([f"{choice.budget / 1e12:.4g}", best, shown(choice.runner_up), overlap, difference, chance])
    if table.unplaced:
        notes.append("not placed (FLOPs unknown): " + ", ".join(named(point) for point in table.unplaced))
    if mixed:
        notes.append(mixed)
    parts = ["compute-optimal frontier: " + (", ".join(named(point) for point in result.frontier.points) or "–")]
    if table.choices:
        parts.append(with_notes(Table(["budget TFLOPs", "use", "runner-up", "overlap", "paired difference [95%]",
                                       "p_best"], rows, ["right", "left", "left", "left", "left", "right"]
                                      ).render(markdown), notes, markdown))
    else:
        parts.append(with_notes("no point could be placed: every point's FLOPs are unknown", notes, markdown))
    if result.fits:
        parts.append(format_fits(result.fits, markdown))
    if result.predicted.choices:
        rows = [[f"{choice.budget / 1e12:.4g}", shown(choice.best), shown(choice.runner_up)]
                for choice in result.predicted.choices]
        parts.append(f"past the largest n ({star} predicted by the fitted law, not measured; FLOPs extrapolated):"
                     + "\n" * (1 + markdown)
                     + Table(["budget TFLOPs", "use", "runner-up"], rows, ["right", "left", "left"]).render(markdown))
    return "\n\n".join(parts)
