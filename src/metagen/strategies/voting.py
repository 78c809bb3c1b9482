"""Grouping extracted answers into equivalence classes and summing their votes.

weighted vote: â = argmax_a Σ_i v(y_i)·1[a_i = a]; majority voting is v ≡ 1.
Answers are grouped by `answers_match` (math-aware when asked), each class named by its first
member. Ties go to the class seen first. Candidates cut before their constraint accepted them
(complete=False) neither vote nor win while a complete candidate exists (`prefer_complete`).
O(N·A) answer comparisons for N candidates, A classes. `VotingConfig` is what every vote over n
samples is configured by (self-consistency's config; weighted and Borda voting add their weights').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.answers import answers_match, check_answer_field
from metagen.strategies.options import check_options, option
from metagen.strategies.spec import shared


@dataclass(frozen=True)
class VotingConfig:
    """n: candidates sampled; params: how each is sampled (its `n` is overridden by `n`); pattern,
    math, answer_field: how answers are extracted and compared (as `StrategyOptions` declares)."""

    n: int = option(8, int, "candidates sampled", low=1, sizes_work=True)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    pattern: str | None = shared("pattern")
    math: bool = shared("math")
    answer_field: str | None = shared("answer_field")  # the answer is this field of a JSON output (not pattern)

    def __post_init__(self) -> None:
        check_options(self)
        check_answer_field(self.pattern, self.answer_field)


def sample_answers(generator, prompt, params, n: int, extract, rng=None) -> tuple[list[Completion], Cost]:
    """n candidates of `prompt` (one `generate` call) with their extracted answers, and its cost.
    A generator that cannot honour `params.structured_outputs` is refused before the call."""
    caps.require_constraint(params, generator, "voting over structured outputs")
    result = generator.generate(prompt, replace(params, n=n), generator=rng)
    candidates = result.completions
    for candidate in candidates:
        candidate.answer = extract(candidate.text)
    return candidates, result.cost


def tally(candidates: Sequence[Completion], weights: Sequence[float], math: bool = False) -> dict[str, float]:
    """answer class -> Σ weights of the candidates whose answer falls in it (None answers skip)."""
    votes: dict[str, float] = {}
    eligible = {id(c) for c in prefer_complete(list(candidates))}
    for candidate, weight in zip(candidates, weights):
        if candidate.answer is None or id(candidate) not in eligible:
            continue
        key = next((name for name in votes if answers_match(name, candidate.answer, math)), candidate.answer)
        votes[key] = votes.get(key, 0.0) + float(weight)
    return votes


def winner(candidates: Sequence[Completion], votes: dict[str, float], math: bool = False) -> Completion:
    """The first eligible candidate whose answer is in the top-voted class (the first eligible
    candidate if none; eligible: see `prefer_complete`)."""
    eligible = prefer_complete(list(candidates))
    if not votes:
        return eligible[0]
    best = max(votes, key=votes.get)  # dicts keep insertion order: ties go to the first seen
    return next(c for c in eligible if answers_match(best, c.answer, math))
