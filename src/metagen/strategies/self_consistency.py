"""Self-consistency (Wang et al. 2023): sample N reasoning paths, return the majority answer.

    â = argmax_a Σ_i 1[extract(y_i) = a]

Answers are extracted by regex or a function and compared as math with math-verify when
`math=True` ("0.5", "1/2", "\\frac{1}{2}" are one answer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import Completion, GenerationResult
from metagen.scoring.answers import AnswerExtractor, extract_answer
from metagen.strategies import runners
from metagen.strategies.options import configure
from metagen.strategies.spec import StrategySpec, register
from metagen.strategies.voting import VotingConfig, sample_answers, tally, winner

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class SelfConsistencyConfig(VotingConfig):
    """`VotingConfig`: n reasoning paths sampled, each answer one vote."""


def self_consistency(
    generator: Generator,
    prompt: Prompt,
    config: SelfConsistencyConfig | None = None,
    extractor: AnswerExtractor | None = None,
    *,
    rng: torch.Generator | None = None,
    voters: Callable[[list[Completion]], list[Completion]] | None = None,
) -> GenerationResult:
    """Majority vote over the answers of `config.n` sampled paths; voters(candidates): the ones
    that vote and may win (None: all; code_cluster keeps those passing the examples)."""
    config = config or SelfConsistencyConfig()
    extract = extractor or (lambda text: extract_answer(text, config.pattern, config.answer_field))
    candidates, cost = sample_answers(generator, prompt, config.params, config.n, extract, rng)
    voting = candidates if voters is None else voters(candidates)
    votes = tally(voting, [1.0] * len(voting), config.math)
    return GenerationResult(candidates, cost=cost, chosen=winner(voting, votes, config.math), votes=votes)


def _runner(generator, prompt, n, params, options, rng, overrides):
    config = SelfConsistencyConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return self_consistency(generator, prompt, configure(config, overrides), rng=rng)


def _code_cluster(generator, prompt, n, params, options, rng, overrides):
    """AlphaCode-style filtering and clustering (`runners.cluster_keys`): the programs that fail
    one of the prompt's docstring examples are dropped, the survivors clustered by their outputs
    on the examples' calls and one of the largest cluster returned (ties: the cluster seen
    first); when none survives (or there are no examples), every program is clustered. Cost: the
    samples' plus the sandbox's wall seconds. result.votes: cluster key -> size (survivors only);
    each candidate's answer is then extracted from its text as for best_of_n (a key is no answer
    a grader could read)."""
    key, spent, survivors = runners.cluster_keys(prompt)  # digests compare as strings, never as math
    config = configure(SelfConsistencyConfig(n, params, math=False), overrides)
    result = self_consistency(generator, prompt, config, key, rng=rng, voters=survivors)
    for cost in spent:
        result.cost += cost
    return runners.with_answers(result, options)

# code clusters vote over keys of program outputs, not extracted answers: no pattern, math or field
CLUSTER_SET = frozenset({"n", "params", "pattern", "math", "answer_field"})

register(StrategySpec("self_consistency", "majority vote over extracted answers", _runner,
                      pooled=True, votes=True, config=SelfConsistencyConfig), __name__)
register(StrategySpec("code_cluster", "code: programs clustered by their outputs on the prompt's docstring example "
                      "calls (AlphaCode), one from the largest cluster", _code_cluster,
                      pooled=True, config=SelfConsistencyConfig, set_by_run=CLUSTER_SET), __name__)
