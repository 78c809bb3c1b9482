"""Coverage and summary statistics for evaluation curves."""

from __future__ import annotations

import math

from metagen.theory.pass_rate import pass_at_k  # the one implementation (floor 0)


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(count))."""
    count = len(values)
    if count == 0:
        return float("nan"), float("nan")
    mean = sum(values) / count
    if count == 1:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (count - 1)
    return mean, math.sqrt(variance / count)
