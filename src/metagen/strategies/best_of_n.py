"""Best-of-N: sample N candidates, return the one the scorer rates highest.

    ŷ = argmax_{y_i ∈ {y_1..y_N} ~ p(·|x)} s(x, y_i)

Cost: one prefill + N rows decoded as one batch, plus whatever the scorer spends (any
`Scorer`, or a function (prompt_text, candidate) -> float).

The default scorer is self-certainty (Kang et al., 2025): the mean over generated tokens of
KL(uniform ‖ p(·|prefix)), which needs every next-token distribution (a `LocalGenerator`
reports them); the registry's `best_of_n` is the same strategy, and `best_of_n_logprob` is
the one by mean token log-probability (`scorer=mean_logprob`), which any generator that
returns log-probabilities supports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.result import GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scorer, as_scorer
from metagen.scoring.logprob import mean_logprob, self_certainty
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import CERTAINTY, StrategySpec, register

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator
    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class BestOfNConfig:
    """n: candidates sampled; params: how each is sampled (its `n` is overridden by `n`)."""

    n: int = option(8, int, "candidates sampled", low=1, sizes_work=True)
    params: SamplingParams = SamplingParams(temperature=0.8, max_tokens=256)

    def __post_init__(self) -> None:
        check_options(self)


def best_of_n(
    generator: Generator,
    prompt: Prompt,
    config: BestOfNConfig | None = None,
    scorer: Scorer = self_certainty,
    *,
    rng: torch.Generator | None = None,
) -> GenerationResult:
    """Sample `config.n` candidates and keep the highest-scoring one (first among ties) among the
    complete ones (see `prefer_complete`)."""
    config = config or BestOfNConfig()
    caps.require_constraint(config.params, generator, "best_of_n with structured_outputs")
    result = generator.generate(prompt, replace(config.params, n=config.n), generator=rng)
    candidates = result.completions
    scores = as_scorer(scorer)(prompt, candidates)
    for candidate, value in zip(candidates, scores.values):
        candidate.score = value
    chosen = max(prefer_complete(candidates), key=lambda c: c.score)  # never a cut output over a complete one
    return GenerationResult(candidates, cost=result.cost + scores.cost, chosen=chosen)


def _runner(scorer):
    """The registry's runner of best-of-n by `scorer`."""

    def run(generator, prompt, n, params, options, rng, overrides):
        config = configure(BestOfNConfig(n, params), overrides)
        return runners.with_answers(best_of_n(generator, prompt, config, scorer, rng=rng), options)

    return run


def best_by_text_value(generator, prompt, n, params, options, rng, overrides):
    """best_of_n_value's runner with a value that reads an answer's text alone
    (`spec.value_reads_text_alone`): the best of n samples drawn in one call (ties: the first;
    complete ones first), by

      - "tests": the share of the prompt's docstring examples their programs pass. A prompt
        without examples gives no score: the first sample (complete ones first) is returned and
        every candidate's score stays None. Cost: the samples' plus the sandbox's wall seconds.
      - "steps" or a PRM (prm:PATH, reward:URL...): the min over the sample's steps (split at
        `options.step_delimiter`) of the step verifier's or the PRM's step scores, as the
        searches value a solution (`step_prm.text_value`). Cost: the samples' plus the PRM's.

    Drawn in one call, the samples are what the harness stores in a pool: it evaluates this from
    the pool at every n (`StrategySpec.is_pooled`)."""
    from metagen.scoring.base import prompt_text

    if options.aggregation != "best":
        raise ValueError(f"aggregation={options.aggregation!r} applies to the leaves of a tree search; with "
                         f"value={options.value!r} best_of_n_value keeps the best sample (aggregation 'best')")
    config = configure(BestOfNConfig(n, params), overrides)
    if options.value != "tests":
        from metagen.scoring.process_reward import TextValueScorer
        from metagen.scoring.step_prm import text_value

        value = text_value(options.value, None, prompt_text(prompt), options.step_delimiter, options.value_parameters)
        return runners.with_answers(best_of_n(generator, prompt, config, TextValueScorer(value), rng=rng), options)
    from metagen.scoring.example_tests import ExampleScorer, ExampleTests

    tests = ExampleTests(prompt_text(prompt))
    if tests.verifier is not None:
        return runners.with_answers(best_of_n(generator, prompt, config, ExampleScorer(tests), rng=rng), options)
    result = generator.generate(prompt, replace(config.params, n=config.n), generator=rng)
    result.chosen = prefer_complete(result.completions)[0]
    return runners.with_answers(result, options)


register(StrategySpec("best_of_n", "best of n samples by self-certainty", _runner(self_certainty),
                      extracts=True, pooled=True, needs=CERTAINTY, config=BestOfNConfig), __name__)
register(StrategySpec("best_of_n_logprob", "best of n samples by mean token logprob", _runner(mean_logprob),
                      extracts=True, pooled=True, needs=frozenset({caps.LOGPROBS}), config=BestOfNConfig), __name__)
