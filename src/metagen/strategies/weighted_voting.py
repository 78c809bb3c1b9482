"""Weighted voting: each sampled answer votes with its score.

    â = argmax_a Σ_i v(y_i)·1[a_i = a]

With v ≡ 1 it is self-consistency (Wang et al. 2023); it is also MBR with the utility
v(y')·1[a(y) = a(y')]. Scores must be non-negative weights (e.g. a verifier's probability);
`exp_scores=True` turns log-probability scores into weights exp(s).
"""

from __future__ import annotations

import math as _math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.scoring.answers import AnswerExtractor, extract_answer
from metagen.scoring.base import Scorer, as_scorer
from metagen.scoring.logprob import mean_logprob
from metagen.strategies.options import configure, option
from metagen.strategies.spec import CERTAINTY, StrategySpec, register
from metagen.strategies.voting import VotingConfig, sample_answers, tally, winner

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class WeightedVotingConfig(VotingConfig):
    """`VotingConfig`, and exp_scores: weight = exp(score)."""

    exp_scores: bool = option(True, bool, "weight = exp(score) (log-probability scores); false: the score itself")


def weighted_voting(
    generator: Generator,
    prompt: Prompt,
    config: WeightedVotingConfig | None = None,
    scorer: Scorer = mean_logprob,
    extractor: AnswerExtractor | None = None,
    *,
    rng: torch.Generator | None = None,
) -> GenerationResult:
    """Sum each answer's candidate weights and return a candidate of the heaviest answer."""
    config = config or WeightedVotingConfig()
    extract = extractor or (lambda text: extract_answer(text, config.pattern, config.answer_field))
    candidates, cost = sample_answers(generator, prompt, config.params, config.n, extract, rng)
    scores = as_scorer(scorer)(prompt, candidates)
    weights = []
    for candidate, value in zip(candidates, scores.values):
        candidate.score = value
        weight = _math.exp(candidate.score) if config.exp_scores else candidate.score
        if weight < 0:
            raise ValueError(f"candidate weight {weight} is negative: scores must be >= 0 unless exp_scores=True")
        weights.append(weight)
    votes = tally(candidates, weights, config.math)
    return GenerationResult(candidates, cost=cost + scores.cost, chosen=winner(candidates, votes, config.math),
                            votes=votes)


def _runner(generator, prompt, n, params, options, rng, overrides):
    from metagen.scoring.logprob import self_certainty

    config = WeightedVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return weighted_voting(generator, prompt, configure(config, overrides), self_certainty, rng=rng)

register(StrategySpec("weighted_voting", "answers weighted by self-certainty", _runner, pooled=True,
                      needs=CERTAINTY, votes=True, defaults=(("exp_scores", False),),
                      config=WeightedVotingConfig), __name__)
