"""The runners of the registry's strategies: runner(generator, prompt, n, params, options, rng,
overrides) -> GenerationResult, each building its strategy's config from n, the request's params,
the shared `StrategyOptions` and the overrides, and calling the strategy. Each is given the
objects it runs (a scorer, a utility's class, a chain program, a search and its config), never a
name to look up; what they import at run time (scorers' backends, the sandbox) loads there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from metagen.sampling import SamplingParams
from metagen.strategies.options import configure
from metagen.strategies.spec import SEARCH, StrategyOptions, StrategySpec, register, value_reads_text_alone


def with_answers(result, options: StrategyOptions):
    """Fill in each candidate's extracted answer (for strategies that do not extract one)."""
    from metagen.scoring.answers import extract_answer

    for candidate in result.completions:
        candidate.answer = extract_answer(candidate.text, options.pattern, options.answer_field)
    return result


def cluster_keys(prompt):
    """(key, spent, survivors) for AlphaCode's filter-then-cluster (Li et al. 2022) over the
    prompt's docstring examples (`ExampleTests`): key(text) is a reply's cluster key (its outputs
    on the examples' calls, `ExampleTests.cluster_key`), each call's sandbox cost appended to
    `spent`; survivors(candidates) -> the candidates whose program passed every example (their
    keys seen through `key`), or all of them when none did or the prompt has no examples (then
    nothing can be filtered, and clustering everything beats an empty vote)."""
    from metagen.scoring.base import prompt_text
    from metagen.scoring.example_tests import ExampleTests

    tests, spent, passed = ExampleTests(prompt_text(prompt)), [], {}

    def key(text):
        found, cost = tests.cluster_key(text)
        spent.append(cost)
        if found is not None:  # the program loaded and ran: its verdict comes from the same (cached) run
            passed[text] = tests.score(text)[0] == 1.0
        return found

    def survivors(candidates):
        kept = [candidate for candidate in candidates if passed.get(candidate.text)]
        return kept or list(candidates)

    return key, spent, survivors


def greedy(generator, prompt, n, params, options, rng, overrides):
    result = generator.generate(prompt, replace(params, temperature=0.0, n=1), generator=rng)
    result.chosen = result.completions[0]
    return with_answers(result, options)


def chain(program: Callable, config_class: type | None = None):
    """The runner of chain program `program(generator, question, config, rng=)` (chain_programs.py);
    config_class: its config (None: ChainConfig)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring.base import prompt_text
        from metagen.strategies.chain import ChainConfig

        config = configure((config_class or ChainConfig)(params=replace(params, n=1), pattern=options.pattern),
                           overrides)
        return program(generator, prompt_text(prompt), config, rng=rng)

    return run


def tree(search: Callable, config_class: type, budget: Callable[[int, SamplingParams], dict],
         fixed_step: bool = False):
    """The runner of tree search `search` with its config dataclass `config_class`; budget(n,
    params): the config fields n sets; fixed_step: the runner sets `step` itself (not the step
    delimiter)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.strategies.tree.node import StepConfig
        from metagen.strategies.tree.runner import run_search

        params = replace(params, n=1)
        common = {"params": params, "pattern": options.pattern, "answer_field": options.answer_field,
                  "math": options.math, "aggregation": options.aggregation}
        if not fixed_step:
            common["step"] = StepConfig(options.step_delimiter, 64)
        config = configure(config_class(**common, **budget(n, params)), overrides)
        return run_search(search, config, generator, prompt, options, rng)

    return run


def whole_answer_or_tree(tree_runner, whole_answer_runner):
    """best_of_n_value's runner: with a value that reads an answer's text alone
    (`value_reads_text_alone`) `whole_answer_runner`, the best of n samples drawn in one call
    (`best_of_n.best_by_text_value`, so the harness evaluates it from a pool); else `tree_runner`
    (a one-step tree search)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        if value_reads_text_alone(options):
            return whole_answer_runner(generator, prompt, n, params, options, rng, overrides)
        return tree_runner(generator, prompt, n, params, options, rng, overrides)

    return run


def tree_spec(name, description, search, config, budget, set_by_run, fixed_step=False, defaults=(),
              whole_answer=None) -> StrategySpec:
    """The entry of value-guided tree search `search` with its config dataclass `config`, over a
    local cache or a server's step continuations; budget(n, params): the config fields n sets
    (`set_by_run`: their names); whole_answer: for a search that values whole answers only, its
    runner when given a whole-answer value (it then runs pooled, `StrategySpec.whole_answer`)."""
    runner = tree(search, config, budget, fixed_step)
    return StrategySpec(name, description, runner if whole_answer is None else whole_answer_or_tree(runner, whole_answer),
                        pooled=False, uses_value=True, whole_answer=whole_answer is not None, defaults=tuple(defaults),
                        needs_any=SEARCH, config=config,
                        set_by_run=frozenset({"params", *set_by_run} | ({"step"} if fixed_step else set())))


LAMBDA = 4.0  # tokenwise_cd's default strength
BLOCK_TOKENS = 16  # blockwise_cd's default block length


def kept(n: int) -> int:
    return max(1, n // 4)


def whole_answer_step(params: SamplingParams):
    """best_of_n_value's one step: the whole answer (no delimiter, up to max_tokens)."""
    from metagen.strategies.tree.node import StepConfig

    return StepConfig(None, params.max_tokens)


# MBR utilities, built per run from the run's generator (their backends load when built)
def chrf(generator):
    from metagen.scoring.utilities import ChrF

    return ChrF()


def bleu(generator):
    from metagen.scoring.utilities import Bleu

    return Bleu()


def edit_similarity(generator):
    from metagen.scoring.utilities import EditSimilarity

    return EditSimilarity()


def embedding_cosine(generator):
    from metagen.scoring.embeddings import EmbeddingCosine

    return EmbeddingCosine()


def llm_judge(generator):
    """The run's own generator as the judge of agreement (`LLMJudgeUtility`)."""
    from metagen.scoring.judge import LLMJudgeUtility

    return LLMJudgeUtility(generator)


register(StrategySpec("greedy", "one greedy (temperature 0) completion", greedy, extracts=True, pooled=False,
                      budget="none", samples=False), __name__)
