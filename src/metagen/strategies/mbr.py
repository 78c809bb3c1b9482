"""Minimum Bayes risk decoding (Bertsch et al. 2023): sample N candidates and
return the one with the highest expected utility against the others, which stand in for samples
of the model's distribution:

    ŷ = argmax_i Ū_i,    Ū_i = (1/N) Σ_j u(y_i, y_j)    ≈ E_{y' ~ p(·|x)}[u(y_i, y')]

Self-pairs: by default (include_self=True) the average runs over all N samples, counting
u(y_i, y_i) for each candidate; with `AnswerAgreement` that is what makes MBR equal weighted
voting (the self-pair is the candidate's own vote). For similarity utilities (chrF, BLEU, edit
similarity, cosine) u(y, y) is the same constant for every y and only shifts all Ū_i
alike; include_self=False averages over j ≠ i instead (divided by N − 1), which spares a judge
utility N calls.

Cost: one prefill + N rows decoded as one batch, plus what the utility spends (O(N²) utility
evaluations; N(N−1) without self-pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.result import GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt
    from metagen.scoring.utilities import Utility


@dataclass(frozen=True)
class MBRConfig:
    """n: candidates sampled (each is a hypothesis and a pseudo-reference); params: how each is
    sampled (its `n` is overridden by `n`); include_self: count u(y_i, y_i) in Ū_i and average
    over N instead of N − 1 (needed for MBR = weighted voting)."""

    n: int = option(8, int, "candidates sampled", low=1, sizes_work=True)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    include_self: bool = option(True, bool, "count u(y_i, y_i): average over N, not N - 1 (MBR = weighted voting)")

    def __post_init__(self) -> None:
        check_options(self)
        if not self.include_self and self.n < 2:
            raise ValueError(f"n={self.n} is out of range: must be >= 2 without include_self (a candidate needs "
                             "another one as pseudo-reference)")


def expected_utilities(utilities: np.ndarray, include_self: bool = False) -> np.ndarray:
    """Ū: (N,) row means of U: (N, N), over j ≠ i (divided by N − 1) or over all j (by N).
    Self-pairs are not read when include_self=False (they may be NaN)."""
    import numpy as np  # here: importing the config imports no numpy

    n = utilities.shape[0]
    if include_self:
        return utilities.mean(axis=1)
    off_diagonal = np.where(np.eye(n, dtype=bool), 0.0, utilities)
    return off_diagonal.sum(axis=1) / (n - 1)


def mbr(
    generator: Generator,
    prompt: Prompt,
    config: MBRConfig | None = None,
    utility: Utility | None = None,
    *,
    rng: torch.Generator | None = None,
) -> GenerationResult:
    """Sample `config.n` candidates, score each by its expected utility Ū_i (`Completion.score`),
    return the highest (first among ties). utility: default chrF (the `mbr` extra)."""
    config = config or MBRConfig()
    caps.require_constraint(config.params, generator, "mbr with structured_outputs")
    if utility is None:
        from metagen.scoring.utilities import ChrF

        utility = ChrF()
    result = generator.generate(prompt, replace(config.params, n=config.n), generator=rng)
    candidates = result.completions
    utilities, utility_cost = utility(prompt, candidates, diagonal=config.include_self)  # (N, N)
    scores = expected_utilities(utilities, config.include_self)  # (N,)
    for candidate, value in zip(candidates, scores.tolist()):
        candidate.score = value
    eligible = {id(c) for c in prefer_complete(candidates)}  # cut outputs count as references, never win
    chosen = max((c for c in candidates if id(c) in eligible), key=lambda c: c.score)
    return GenerationResult(candidates, cost=result.cost + utility_cost, chosen=chosen)


def _runner(utility):
    """The registry's runner of MBR with the utility `utility(generator)` builds (on first use: a
    utility's backend, sacrebleu or a sentence encoder, loads when it runs)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        config = configure(MBRConfig(n, params, include_self=True), overrides)
        return runners.with_answers(mbr(generator, prompt, config, utility(generator), rng=rng), options)

    return run

register(StrategySpec("mbr_chrf", "MBR with chrF", _runner(runners.chrf), extracts=True, pooled=True,
                      config=MBRConfig), __name__)
register(StrategySpec("mbr_bleu", "MBR with BLEU", _runner(runners.bleu), extracts=True, pooled=True,
                      config=MBRConfig), __name__)
register(StrategySpec("mbr_edit", "MBR with edit similarity", _runner(runners.edit_similarity), extracts=True,
                      pooled=True, config=MBRConfig), __name__)
register(StrategySpec("mbr_embedding", "MBR with MiniLM embedding cosine", _runner(runners.embedding_cosine),
                      extracts=True, pooled=True, config=MBRConfig), __name__)
# the judge is the run's own generator, called O(n²) times: it cannot run from a stored pool
register(StrategySpec("mbr_judge", "MBR with the model judging whether two answers agree (P(Yes), O(n²) calls)",
                      _runner(runners.llm_judge), extracts=True, pooled=False,
                      needs=frozenset({caps.TOP_LOGPROBS}),
                      why="the model judges each pair of answers, reading the top logprobs of its Yes/No token",
                      config=MBRConfig), __name__)
