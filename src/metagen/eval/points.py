"""One evaluated configuration: a `CurvePoint` per (model, strategy, n) and the statistics that
make it — the mean score over problems, its standard error and a percentile-bootstrap interval,
and the mean cost per problem. The harness builds points, the allocator adds its own, and the
frontier, tables and plots read them."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.eval.metrics import mean_and_stderr

if TYPE_CHECKING:
    import numpy

ORACLE = "pass@k"  # the strategy name of the oracle coverage rows: not a configuration one can run
BOOTSTRAP_RESAMPLES = 2000
LEVEL = 0.95


def bootstrap_interval(per_problem: Sequence[float], rng: "numpy.random.Generator",
                       resamples: int = BOOTSTRAP_RESAMPLES, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `per_problem` (each problem's score: 0/1, or
    the fraction of n-subsets answered correctly for a pooled strategy) over problems (Efron 1979).

    Draw R resamples of the P problems with replacement, x*_r = mean of resample r; the interval
    is the (α/2, 1 − α/2) empirical quantiles of x*_1..x*_R, α = 1 − level, each taken as the
    smallest x* whose empirical CDF reaches the level ("inverted CDF":
    sorted(x*)[ceil(R·q) − 1]). For 0/1 scores with k of P correct, x* ~ Binomial(P, k/P) / P
    exactly, so the interval tends to that distribution's quantiles as R grows.

    rng: a seeded `numpy.random.Generator` (the only randomness). Time O(R·P), memory
    O(R + max(P, 2^20)) (resamples drawn in chunks of about 2^20 indices)."""
    import numpy as np

    values = np.asarray(per_problem, dtype=np.float64)  # (P,)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"per_problem has shape {values.shape}: need a non-empty list of per-problem scores")
    if not np.all(np.isfinite(values)):
        raise ValueError("per_problem holds a non-finite score: every score must be a finite number")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r} is out of range: must be an integer >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} is out of range: must be in (0, 1)")
    count = values.size
    means = np.empty(resamples)  # (R,)
    chunk = max(1, (1 << 20) // count)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        indices = rng.integers(0, count, size=(stop - start, count))  # (chunk, P)
        means[start:stop] = values[indices].mean(axis=1)
    means.sort()
    alpha = 1.0 - level

    def quantile(q: float) -> float:
        return float(means[max(math.ceil(resamples * q - 1e-9), 1) - 1])

    return quantile(alpha / 2), quantile(1.0 - alpha / 2)


@dataclass
class CurvePoint:
    """One (model, strategy, n) point: accuracy over problems, its standard error and 95%
    percentile-bootstrap interval over problems (`bootstrap_interval`; None when not
    computed), and the mean cost per problem (FLOPs, generated tokens, wall seconds, ...).
    `model`: the model's name (`run_setup`'s model identity), so points of several models can
    be put side by side. samples: the mean samples drawn per problem (pooled strategies: n, or
    fewer for one that stops early; None where not counted). flops_estimate: how cost.flops
    were estimated when not by the architecture's formula (`Generator.flops_estimate`, e.g. a
    remote model's 2·N·tokens); None: counted exactly, or unknown. chat: whether the model's text
    prompts went through a chat template (a local model's, or a server's /v1/chat/completions)
    rather than raw (`code_prompts.chat_applies`); None: not recorded. Models whose prompts differ
    so are flagged where their points are shown together (`mixed_prompts_note`). task: the
    built-in task the problems came from (`metagen eval --task`), None for a data file.
    per_problem: problem id -> that problem's score, in the problems' order (None: not kept, as
    in rows of an older summary.json); what paired comparisons resample (`paired.py`).
    predicted: the point was not measured but read off a fitted scaling law (`scaling_fit.py`):
    no interval, no per-problem scores, FLOPs extrapolated.
    escalated: a cascade's share of problems sent to its large model (`cascade.py`), None for others."""

    strategy: str
    n: int
    accuracy: float
    stderr: float
    problems: int
    cost: Cost
    interval: tuple[float, float] | None = None
    model: str = ""
    samples: float | None = None
    flops_estimate: str | None = None
    chat: bool | None = None
    task: str | None = None
    per_problem: dict[str, float] | None = None
    predicted: bool = False
    escalated: float | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return self.model, self.strategy, self.n

    def to_dict(self) -> dict:
        data = {"model": self.model, "strategy": self.strategy, "n": self.n, "accuracy": self.accuracy,
                "interval": None if self.interval is None else list(self.interval),
                "stderr": self.stderr if math.isfinite(self.stderr) else None,
                "problems": self.problems, "cost": self.cost.to_dict()}
        if self.samples is not None:
            data["samples"] = self.samples
        if self.flops_estimate is not None:
            data["flops_estimate"] = self.flops_estimate
        if self.chat is not None:
            data["chat"] = self.chat
        if self.task is not None:
            data["task"] = self.task
        if self.per_problem is not None:
            data["per_problem"] = dict(self.per_problem)
        if self.predicted:
            data["predicted"] = True
        if self.escalated is not None:
            data["escalated"] = self.escalated
        return data

    @classmethod
    def from_dict(cls, row: dict) -> "CurvePoint":
        """A row of `to_dict` (a `--json` output, summary.json) back; ValueError naming a missing field."""
        missing = [name for name in ("strategy", "n", "accuracy", "cost") if name not in row]
        if missing:
            raise ValueError(f"result row {row!r:.80} has no field {missing[0]!r}")
        fields = sorted(Cost().to_dict())
        if not isinstance(row["cost"], dict) or set(row["cost"]) - set(fields):
            raise ValueError(f"result row field 'cost' is {row['cost']!r:.80}: expected an object of fields among {fields}")
        interval = row.get("interval")
        per_problem = row.get("per_problem")
        if per_problem is not None and not (isinstance(per_problem, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in per_problem.values())):
            raise ValueError(f"result row field 'per_problem' is {per_problem!r:.80}: expected an object of "
                             "problem id -> score")
        return cls(row["strategy"], row["n"], row["accuracy"], _or_nan(row.get("stderr")),
                   row.get("problems", 0), Cost(**row["cost"]), None if interval is None else tuple(interval),
                   row.get("model", ""), row.get("samples"), row.get("flops_estimate"), row.get("chat"),
                   row.get("task"), per_problem, bool(row.get("predicted", False)), row.get("escalated"))


def _or_nan(value) -> float:
    return float("nan") if value is None else value


def prompt_formats(points: Sequence[CurvePoint]) -> dict[str, bool]:
    """model -> whether its text prompts went through a chat template, over the points that
    record it (`CurvePoint.chat`), in order of first appearance."""
    formats: dict[str, bool] = {}
    for point in points:
        if point.chat is not None:
            formats.setdefault(point.model, point.chat)
    return formats


def mixed_prompts_note(points: Sequence[CurvePoint]) -> str | None:
    """The line flagging points of models given their prompts differently — some through a chat
    template, some as raw text — whose accuracies then compare prompt formats as well as models;
    None when every model recorded got them one way."""
    formats = prompt_formats(points)
    if len(set(formats.values())) < 2:
        return None
    templated = ", ".join(model or "model" for model, chat in formats.items() if chat)
    raw = ", ".join(model or "model" for model, chat in formats.items() if not chat)
    return (f"! prompts differ: {templated} through a chat template, {raw} as raw text; accuracies compare prompt "
            "formats as well as models (--chat or --no-chat gives every model one format)")


def stable_seed(*parts) -> int:
    """A seed that is the same in every process for the same parts (CRC-32 of their text)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def mean_cost(costs: list[Cost]) -> Cost:
    """The mean of per-problem costs (an empty list: zero cost)."""
    total = Cost()
    for cost in costs:
        total += cost
    return total.scaled(1 / max(len(costs), 1))


def curve_point(strategy: str, n: int, scores: list[float], cost: Cost, model: str, seed: int,
                samples: float | None = None, problem_ids: Sequence[str] | None = None) -> CurvePoint:
    """A curve point from per-problem scores: mean, standard error and the bootstrap interval
    (its rng seeded by (seed, strategy, n), so a rerun reports the same interval); with
    `problem_ids` (one per score) the scores are kept by problem (`CurvePoint.per_problem`)."""
    import numpy

    accuracy, stderr = mean_and_stderr(scores)
    interval = (bootstrap_interval(scores, numpy.random.default_rng(stable_seed(seed, strategy, n, "bootstrap")))
                if scores else None)
    per_problem = None
    if problem_ids is not None:
        if len(problem_ids) != len(scores) or len(set(problem_ids)) != len(scores):
            raise ValueError(f"problem_ids has {len(problem_ids)} ids ({len(set(problem_ids))} distinct) for "
                             f"{len(scores)} scores: need one distinct id per score")
        per_problem = dict(zip(problem_ids, map(float, scores)))
    return CurvePoint(strategy, n, accuracy, stderr, len(scores), cost, interval, model, samples,
                      per_problem=per_problem)
