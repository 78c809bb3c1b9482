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
from metagen.strategies.spec import SEARCH, StrategyOptions, StrategySpec, register, value_scores_whole_answers


def _with_answers(result, options: StrategyOptions):
    """Fill in each candidate's extracted answer (for strategies that do not extract one)."""
    from metagen.scoring.answers import extract_answer

    for candidate in result.completions:
        candidate.answer = extract_answer(candidate.text, options.pattern, options.answer_field)
    return result


def greedy(generator, prompt, n, params, options, rng, overrides):
    result = generator.generate(prompt, replace(params, temperature=0.0, n=1), generator=rng)
    result.chosen = result.completions[0]
    return _with_answers(result, options)


def best_of_n(scorer):
    """The runner of best-of-n by `scorer` (a function (prompt_text, candidate) -> float)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.strategies.best_of_n import BestOfNConfig, best_of_n

        config = configure(BestOfNConfig(n, params), overrides)
        result = best_of_n(generator, prompt, config, scorer, rng=rng)
        return _with_answers(result, options)

    return run


def self_consistency(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency

    config = SelfConsistencyConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return self_consistency(generator, prompt, configure(config, overrides), rng=rng)


def adaptive_consistency(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.adaptive_consistency import AdaptiveConsistencyConfig, adaptive_consistency

    config = AdaptiveConsistencyConfig(n, params=params, pattern=options.pattern, math=options.math,
                                       answer_field=options.answer_field)
    return adaptive_consistency(generator, prompt, configure(config, overrides), rng=rng)


def weighted_voting(generator, prompt, n, params, options, rng, overrides):
    from metagen.scoring.logprob import self_certainty
    from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

    config = WeightedVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return weighted_voting(generator, prompt, configure(config, overrides), self_certainty, rng=rng)


def borda(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.borda_voting import BordaVotingConfig, borda_voting

    config = BordaVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return borda_voting(generator, prompt, configure(config, overrides), rng=rng)


def mbr(utility: Callable):
    """The runner of MBR with the utility `utility(generator)` builds (on first use: a utility's
    backend, sacrebleu or a sentence encoder, loads when it runs)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.strategies.mbr import MBRConfig, mbr

        config = configure(MBRConfig(n, params, include_self=True), overrides)
        result = mbr(generator, prompt, config, utility(generator), rng=rng)
        return _with_answers(result, options)

    return run


def self_refine(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.self_refine import SelfRefineConfig, self_refine

    # The answers (draft, revisions) keep the request's constraint; a critique is free text.
    critique = replace(params, structured_outputs=None)
    config = SelfRefineConfig(rounds=n - 1, draft_params=params, critique_params=critique, revision_params=params)
    result = self_refine(generator, prompt, configure(config, overrides), rng=rng)
    return _with_answers(result, options)


def chain(program: Callable):
    """The runner of chain program `program(generator, question, config, rng=)` (chain_programs.py)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring.base import prompt_text
        from metagen.strategies.chain import ChainConfig

        config = configure(ChainConfig(params=replace(params, n=1)), overrides)
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


def whole_answer_or_tree(tree_runner):
    """best_of_n_value's runner: with a value that scores finished answers only
    (`value_scores_whole_answers`) the best of n samples drawn in one call (`best_by_tests`, so
    the harness evaluates it from a pool); else `tree_runner` (a one-step tree search)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        if value_scores_whole_answers(options):
            return best_by_tests(generator, prompt, n, params, options, rng, overrides)
        return tree_runner(generator, prompt, n, params, options, rng, overrides)

    return run


def tree_spec(name, description, search, config, budget, set_by_run, fixed_step=False, defaults=(),
              whole_answer=False) -> StrategySpec:
    """The entry of value-guided tree search `search` with its config dataclass `config`, over a
    local cache or a server's step continuations; budget(n, params): the config fields n sets
    (`set_by_run`: their names); whole_answer: it values whole answers only, and runs pooled with
    a whole-answer value (`StrategySpec.whole_answer`)."""
    runner = tree(search, config, budget, fixed_step)
    return StrategySpec(name, description, whole_answer_or_tree(runner) if whole_answer else runner, pooled=False,
                        uses_value=True, whole_answer=whole_answer, defaults=tuple(defaults),
                        needs_any=SEARCH, config=config,
                        set_by_run=frozenset({"params", *set_by_run} | ({"step"} if fixed_step else set())))


def best_by_tests(generator, prompt, n, params, options, rng, overrides):
    """The best of n samples by the share of the prompt's docstring examples their programs pass
    (ties: the first). A prompt without examples gives no score: the first sample (complete
    ones first) is returned and every candidate's score stays None. Cost: the samples' plus
    the sandbox's wall seconds (no FLOPs)."""
    from metagen.scoring.base import prompt_text
    from metagen.scoring.example_tests import ExampleScorer, ExampleTests
    from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
    from metagen.decoding.result import prefer_complete

    if options.aggregation != "best":
        raise ValueError(f"aggregation={options.aggregation!r} applies to the leaves of a tree search; with "
                         f"value={options.value!r} best_of_n_value keeps the best sample (aggregation 'best')")
    tests = ExampleTests(prompt_text(prompt))
    config = configure(BestOfNConfig(n, params), overrides)
    if tests.verifier is not None:
        return _with_answers(best_of_n(generator, prompt, config, ExampleScorer(tests), rng=rng), options)
    result = generator.generate(prompt, replace(config.params, n=config.n), generator=rng)
    result.chosen = prefer_complete(result.completions)[0]
    return _with_answers(result, options)


def code_cluster(adaptive: bool):
    """AlphaCode-style clustering (`code_cluster`) or its adaptive stopping (`adaptive_code_cluster`):
    self-consistency / adaptive self-consistency whose answer is each sample's cluster key
    (`ExampleTests.cluster_key`: its outputs on the docstring examples' calls), plus the
    sandbox's wall seconds. result.votes: cluster key -> size; each candidate's answer is then
    extracted from its text as for best_of_n (a key is no answer a grader could read)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring.base import prompt_text
        from metagen.scoring.example_tests import ExampleTests

        tests, spent = ExampleTests(prompt_text(prompt)), []

        def key(text):
            found, cost = tests.cluster_key(text)
            spent.append(cost)
            return found

        if adaptive:
            from metagen.strategies.adaptive_consistency import AdaptiveConsistencyConfig, adaptive_consistency

            config = configure(AdaptiveConsistencyConfig(n, params=params), overrides)
            result = adaptive_consistency(generator, prompt, config, key, rng=rng)
        else:
            from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency

            config = configure(SelfConsistencyConfig(n, params), overrides)
            result = self_consistency(generator, prompt, config, key, rng=rng)
        for cost in spent:
            result.cost += cost
        return _with_answers(result, options)  # the keys stay in result.votes; answers as for best_of_n

    return run


def verifier_refine(generator, prompt, n, params, options, rng, overrides):
    """Refinement by the prompt's docstring examples: n attempts at most, a sample, then each
    revision shown the examples its predecessor failed (`ExampleTests.verifier`; rounds = n − 1,
    one candidate per round unless the overrides widen it). A prompt without examples has no
    verifier: the first sample (complete ones first) is returned, with no revision. Cost: the
    samples' plus the sandbox's wall seconds."""
    from metagen.scoring.base import prompt_text
    from metagen.scoring.example_tests import ExampleTests
    from metagen.decoding.result import prefer_complete
    from metagen.strategies.verifier_refine import VerifierRefineConfig, verifier_refine

    config = configure(VerifierRefineConfig(initial_candidates=1, rounds=n - 1, revisions_per_round=1, beam=1,
                                            params=replace(params, n=1)), overrides)
    tests = ExampleTests(prompt_text(prompt))
    if tests.verifier is not None:
        return _with_answers(verifier_refine(generator, prompt, tests.verifier, config, rng=rng), options)
    result = generator.generate(prompt, replace(config.params, n=config.initial_candidates), generator=rng)
    result.chosen = prefer_complete(result.completions)[0]
    return _with_answers(result, options)


def tokenwise_cd(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd
    from metagen.strategies.tree.runner import run_search

    params = replace(params, n=1)
    config = TokenwiseCDConfig(n=1, top_k=n, params=params, pattern=options.pattern, answer_field=options.answer_field)
    return run_search(tokenwise_cd, configure(config, overrides), generator, prompt, options, rng, local_only=True)


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
