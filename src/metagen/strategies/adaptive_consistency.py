"""Adaptive self-consistency (Aggarwal et al. 2023): sample in rounds, stop when the leading
answer is the majority with posterior probability >= threshold, at most n_max samples.

    repeat: draw min(round_size, n_max − drawn) samples; v = tally(all answers so far)
    until should_stop(v, threshold, rule) or drawn = n_max;  return the majority answer

The stopping rule reads answer counts only (`stopping.py`), so any grouping of outputs into
classes plugs in (math-aware answer matching here; test-output clusters of programs alike).
Easy problems stop after a few agreeing samples (4 with round_size 1 and the default 0.95),
hard ones use up to n_max: the same accuracy as self-consistency at n_max for fewer samples.
Cost: one generate call per round (a `LocalGenerator` computes the prompt in the first round
only and copies it in the others, `decoding/prompt_cache.py`; a generator that keeps nothing
computes it every round), ⌈drawn / round_size⌉ stopping checks (O(drawn) each for "beta"). The result's candidates
are every sample drawn, in order: len(result.completions) is the budget actually spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring.answers import AnswerExtractor, check_answer_field, extract_answer
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.self_consistency import CLUSTER_SET
from metagen.strategies.spec import StrategySpec, register, shared
from metagen.strategies.stopping import RULES, should_stop
from metagen.strategies.voting import sample_answers, tally, winner

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class AdaptiveConsistencyConfig:
    """The budget, the round size (the last round is cut to n_max), the stopping rule and its
    threshold (`stopping.py`), declared with their fields; params, pattern, math, answer_field: as
    in self-consistency."""

    n_max: int = option(16, int, "most samples drawn", low=1, sizes_work=True)
    round_size: int = option(1, int, "samples per generate call", low=1, sizes_work=True)
    threshold: float = option(0.95, float, "stop when P(the leading answer is the majority) reaches it", above=0,
                              below=1)
    rule: str = option("beta", str, "beta: top two answers, exact; dirichlet: all answers, Monte Carlo",
                       choices=RULES)
    mc_samples: int = option(4096, int, "dirichlet's Monte Carlo draws per check (CPU)", low=1, high=100_000)
    mc_seed: int = option(0, int, "seed of dirichlet's draws")
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)
    pattern: str | None = shared("pattern")
    math: bool = shared("math")
    answer_field: str | None = shared("answer_field")

    def __post_init__(self) -> None:
        check_options(self)
        check_answer_field(self.pattern, self.answer_field)


def adaptive_consistency(
    generator: Generator,
    prompt: Prompt,
    config: AdaptiveConsistencyConfig | None = None,
    extractor: AnswerExtractor | None = None,
    *,
    rng: torch.Generator | None = None,
    voters: Callable[[list[Completion]], list[Completion]] | None = None,
) -> GenerationResult:
    """Majority vote over samples drawn `config.round_size` at a time until the stopping rule
    holds or `config.n_max` are drawn; cost: every round's. voters(candidates): the ones that
    vote (and are counted by the stopping rule) and may win, re-read after every round (None:
    all; adaptive_code_cluster keeps those passing the examples)."""
    config = config or AdaptiveConsistencyConfig()
    extract = extractor or (lambda text: extract_answer(text, config.pattern, config.answer_field))
    candidates, cost = [], Cost()
    while len(candidates) < config.n_max:
        size = min(config.round_size, config.n_max - len(candidates))
        drawn, round_cost = sample_answers(generator, prompt, config.params, size, extract, rng)
        candidates += drawn
        cost += round_cost
        voting = candidates if voters is None else voters(candidates)
        votes = tally(voting, [1.0] * len(voting), config.math)
        if should_stop(list(votes.values()), config.threshold, config.rule,
                       samples=config.mc_samples, seed=config.mc_seed):
            break
    return GenerationResult(candidates, cost=cost, chosen=winner(voting, votes, config.math), votes=votes)


def _runner(generator, prompt, n, params, options, rng, overrides):
    config = AdaptiveConsistencyConfig(n, params=params, pattern=options.pattern, math=options.math,
                                       answer_field=options.answer_field)
    return adaptive_consistency(generator, prompt, configure(config, overrides), rng=rng)


def _code_cluster(generator, prompt, n, params, options, rng, overrides):
    """code_cluster sampled one at a time until the largest cluster is the majority (the stopping
    rule over cluster keys, `runners.cluster_keys`), plus the sandbox's wall seconds. Filtered as
    code_cluster: once a program passes every docstring example, only such programs vote; until
    one does (or without examples), every program is clustered."""
    key, spent, survivors = runners.cluster_keys(prompt)  # digests compare as strings, never as math
    config = configure(AdaptiveConsistencyConfig(n, params=params, math=False), overrides)
    result = adaptive_consistency(generator, prompt, config, key, rng=rng, voters=survivors)
    for cost in spent:
        result.cost += cost
    return runners.with_answers(result, options)

register(StrategySpec("adaptive_consistency", "majority vote sampled one at a time until the leading answer is "
                      "the majority with posterior probability 0.95 (at most n)", _runner,
                      pooled=True, sequential=True, votes=True, config=AdaptiveConsistencyConfig,
                      set_by_run=frozenset({"n_max", "params"})), __name__)
register(StrategySpec("adaptive_code_cluster", "code_cluster sampled one at a time until the largest cluster is the "
                      "majority with posterior probability 0.95 (at most n)", _code_cluster,
                      pooled=True, sequential=True, config=AdaptiveConsistencyConfig,
                      set_by_run=CLUSTER_SET | {"n_max"}), __name__)
