"""Scorers from the generator's own token log-probabilities (no extra model calls)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # strategies import scorers; scorers only need the candidate's shape
    from metagen.strategies.result import Candidate

# A scorer maps (prompt, candidate) to a number, higher is better. These two read the
# candidate's own logprobs and cost no model call.
Scorer = Callable[[str, "Candidate"], float]


def sum_logprob(prompt: str, candidate: Candidate) -> float:
    """log p(y | x) = Σ_t log p(y_t | x, y_<t): the sequence likelihood."""
    return float(sum(candidate.logprobs))


def mean_logprob(prompt: str, candidate: Candidate) -> float:
    """Σ_t log p(y_t | ·) / |y|: likelihood normalized by length (−inf for an empty output)."""
    if not candidate.logprobs:
        return float("-inf")
    return float(sum(candidate.logprobs)) / len(candidate.logprobs)
