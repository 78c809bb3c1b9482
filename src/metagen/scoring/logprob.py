"""Scorers from the generator's own token statistics (no extra model calls).

sum / mean token logprob, and self-certainty (Kang et al. 2025):

    SC(y) = (1/|y|) Σ_t KL(U ‖ p(· | x, y_<t)) = (1/|y|) Σ_t [−log V − (1/V) Σ_v log p(v | x, y_<t)]

the mean divergence of each full next-token distribution from uniform: high when the model
was confident along the way. The per-token terms are computed in the sampling loop from the
raw model distribution (`Completion.certainties`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metagen.scoring.base import FunctionScorer

if TYPE_CHECKING:
    from metagen.decoding.result import Completion


def _sum_logprob(prompt: str, candidate: Completion) -> float:
    """log p(y | x) = Σ_t log p(y_t | x, y_<t): the sequence likelihood."""
    return float(sum(candidate.logprobs))


def _mean_logprob(prompt: str, candidate: Completion) -> float:
    """Σ_t log p(y_t | ·) / |y|: likelihood normalized by length (−inf for an empty output)."""
    if not candidate.logprobs:
        return float("-inf")
    return float(sum(candidate.logprobs)) / len(candidate.logprobs)


def _self_certainty(prompt: str, candidate: Completion) -> float:
    """Mean over tokens of KL(uniform ‖ p) (−inf for an empty output)."""
    if not candidate.token_ids:
        return float("-inf")
    if len(candidate.certainties) != len(candidate.token_ids):
        raise ValueError(
            "self-certainty needs the full next-token distribution of every generated token "
            f"(candidate has {len(candidate.certainties)} certainty values for {len(candidate.token_ids)} tokens); "
            "use a Generator that reports Completion.certainties, such as LocalGenerator"
        )
    return float(sum(candidate.certainties)) / len(candidate.certainties)


sum_logprob = FunctionScorer(_sum_logprob, "sum_logprob")
mean_logprob = FunctionScorer(_mean_logprob, "mean_logprob")
self_certainty = FunctionScorer(_self_certainty, "self_certainty")
