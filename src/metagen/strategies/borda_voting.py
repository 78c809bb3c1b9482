"""Borda voting (Kang et al. 2025): voting weighted by each candidate's rank.

Candidates are ranked by a score (self-certainty by default; rank r = 1 is the highest) and
each votes for its answer with weight

    v(r) = (N − r + 1)^p

so p = 0 is plain majority voting and a large p approaches best-of-N. Equal scores share the
mean of their ranks' weights. The answer with the largest total wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.scoring.answers import AnswerExtractor, extract_answer
from metagen.scoring.base import Scorer, as_scorer
from metagen.scoring.logprob import self_certainty
from metagen.strategies.options import configure, option
from metagen.strategies.spec import CERTAINTY, StrategySpec, register
from metagen.strategies.voting import VotingConfig, sample_answers, tally, winner

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class BordaVotingConfig(VotingConfig):
    """`VotingConfig`, and power: p in v(r) = (N − r + 1)^p."""

    power: float = option(0.5, float, "p in v(r) = (N - r + 1)^p: 0 is majority voting, large p best-of-N", low=0)


def borda_weights(scores: list[float], power: float) -> list[float]:
    """(N − r + 1)^power for each score's rank r (1 = highest); ties share their mean weight."""
    n = len(scores)
    order = sorted(range(n), key=lambda i: -scores[i])
    weights = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        shared = sum((n - r) ** power for r in range(start, end + 1)) / (end - start + 1)
        for position in range(start, end + 1):
            weights[order[position]] = shared
        start = end + 1
    return weights


def borda_voting(
    generator: Generator,
    prompt: Prompt,
    config: BordaVotingConfig | None = None,
    scorer: Scorer = self_certainty,
    extractor: AnswerExtractor | None = None,
    *,
    rng: torch.Generator | None = None,
) -> GenerationResult:
    """Rank `config.n` sampled candidates by `scorer`, vote with Borda weights per answer."""
    config = config or BordaVotingConfig()
    extract = extractor or (lambda text: extract_answer(text, config.pattern, config.answer_field))
    candidates, cost = sample_answers(generator, prompt, config.params, config.n, extract, rng)
    scores = as_scorer(scorer)(prompt, candidates)
    for candidate, value in zip(candidates, scores.values):
        candidate.score = value
    votes = tally(candidates, borda_weights(scores.values, config.power), config.math)
    return GenerationResult(candidates, cost=cost + scores.cost, chosen=winner(candidates, votes, config.math),
                            votes=votes)


def _runner(generator, prompt, n, params, options, rng, overrides):
    config = BordaVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return borda_voting(generator, prompt, configure(config, overrides), rng=rng)

register(StrategySpec("borda", "Borda voting ranked by self-certainty, p = 0.5", _runner, pooled=True,
                      needs=CERTAINTY, votes=True, config=BordaVotingConfig), __name__)
