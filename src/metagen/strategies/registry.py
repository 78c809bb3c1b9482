"""Strategies by name, for the command line and the evaluation harness.

Each entry (a `StrategySpec`, spec.py; its runner in runners.py) runs one strategy with n
samples (or n rounds) on a `Generator`:

    spec = STRATEGIES["weighted_voting"]
    result = spec.run(generator, prompt, n, params, options, rng)
    n, options, overrides = spec.parse({"n": 8, "exp_scores": True})   # options by name, validated
    result = spec.run(generator, prompt, n, params, options, rng, overrides)

What an entry declares (its config dataclass and so its options, pooled, budget, needs) is
described in spec.py.
"""

from __future__ import annotations

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.scoring.logprob import mean_logprob, self_certainty
from metagen.strategies import chain_programs
from metagen.strategies.adaptive_consistency import AdaptiveConsistencyConfig
from metagen.strategies.best_of_n import BestOfNConfig
from metagen.strategies.borda_voting import BordaVotingConfig
from metagen.strategies.chain import ChainConfig
from metagen.strategies.mbr import MBRConfig
from metagen.strategies.runners import (
    BLOCK_TOKENS,
    LAMBDA,
    adaptive_consistency,
    best_of_n,
    borda,
    chain,
    code_cluster,
    greedy,
    kept,
    mbr,
    self_consistency,
    self_refine,
    tokenwise_cd,
    tree,
    weighted_voting,
    whole_answer_or_tree,
    whole_answer_step,
)
from metagen.strategies.runners import bleu, chrf, edit_similarity, embedding_cosine
from metagen.strategies.self_consistency import SelfConsistencyConfig
from metagen.strategies.self_refine import SelfRefineConfig
from metagen.strategies.spec import (
    DEFAULT_N,
    StrategyOptions,
    StrategySpec,
    value_is_head,
    value_scores_whole_answers,
)
from metagen.strategies.tokenwise_cd import TokenwiseCDConfig
from metagen.strategies.tree import astar, blockwise_cd, dvts, mcts, particle_filter, rebase, step_beam_search
from metagen.strategies.weighted_voting import WeightedVotingConfig

__all__ = ["DEFAULT_N", "STRATEGIES", "StrategyOptions", "StrategySpec", "check_options", "default_params",
           "get_strategy", "value_is_head", "value_scores_whole_answers"]


def _tree_spec(name, description, search, config, budget, set_by_run, fixed_step=False, defaults=(),
               whole_answer=False):
    """A value-guided tree search `search` with its config dataclass `config`, over a local cache or a
    server's step continuations; whole_answer: it values whole answers only, and runs pooled with a
    whole-answer value (`StrategySpec.whole_answer`)."""
    runner = tree(search, config, budget, fixed_step)
    return StrategySpec(name, description, whole_answer_or_tree(runner) if whole_answer else runner, pooled=False,
                        uses_value=True, whole_answer=whole_answer, defaults=tuple(defaults),
                        needs_any=SEARCH, config=config,
                        set_by_run=frozenset({"params", *set_by_run} | ({"step"} if fixed_step else set())))


CERTAINTY = frozenset({caps.FULL_DISTRIBUTIONS})  # self-certainty reads every next-token distribution
# chains continue a final assistant message (a prefill, or text around a tool call) until a stop
# string, and read which stop string ended it
CONTINUATION = frozenset({caps.ASSISTANT_CONTINUATION})
# searches extend partial solutions step by step: from the model's cache, or by a server
# continuing the prefix to the step delimiter
SEARCH = (frozenset({caps.LOCAL_CACHE}), frozenset({caps.STEP_CONTINUATION}))
TOKENWISE_WHY = "it values the top-k next tokens at every position, which needs a local model"

# a chain's answer is several requests (reasoning, tool results, a final answer after a prefill):
# one constraint cannot span them, and applied to each it would constrain the reasoning too
UNCONSTRAINED_CHAIN = {"constrains": False, "why_unconstrained": (
    "its output is built from several requests around tool calls and prefills, and a constraint cannot carry "
    "its state from one request to the next; constrain a sampling strategy (best_of_n, self_consistency, ...) "
    "or a tree search instead")}

# code clusters vote over keys of program outputs, not extracted answers: no pattern, math or field
CLUSTER_SET = frozenset({"n", "params", "pattern", "math", "answer_field"})

STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        StrategySpec("greedy", "one greedy (temperature 0) completion", greedy, extracts=True, pooled=False, budget="none",
                     samples=False),
        StrategySpec("best_of_n", "best of n samples by self-certainty", best_of_n(self_certainty), extracts=True, pooled=True,
                     needs=CERTAINTY, config=BestOfNConfig),
        StrategySpec("best_of_n_logprob", "best of n samples by mean token logprob", best_of_n(mean_logprob),
                     extracts=True, pooled=True, needs=frozenset({caps.LOGPROBS}), config=BestOfNConfig),
        StrategySpec("self_consistency", "majority vote over extracted answers", self_consistency, pooled=True,
                     config=SelfConsistencyConfig),
        StrategySpec("adaptive_consistency", "majority vote sampled one at a time until the leading answer is "
                     "the majority with posterior probability 0.95 (at most n)", adaptive_consistency, pooled=True,
                     sequential=True, config=AdaptiveConsistencyConfig,
                     set_by_run=frozenset({"n_max", "params"})),
        StrategySpec("code_cluster", "code: programs clustered by their outputs on the prompt's docstring example "
                     "calls (AlphaCode), one from the largest cluster", code_cluster(adaptive=False), pooled=True,
                     config=SelfConsistencyConfig, set_by_run=CLUSTER_SET),
        StrategySpec("adaptive_code_cluster", "code_cluster sampled one at a time until the largest cluster is the "
                     "majority with posterior probability 0.95 (at most n)", code_cluster(adaptive=True),
                     pooled=True, sequential=True, config=AdaptiveConsistencyConfig,
                     set_by_run=CLUSTER_SET | {"n_max"}),
        StrategySpec("weighted_voting", "answers weighted by self-certainty", weighted_voting, pooled=True,
                     needs=CERTAINTY, defaults=(("exp_scores", False),), config=WeightedVotingConfig),
        StrategySpec("borda", "Borda voting ranked by self-certainty, p = 0.5", borda, pooled=True, needs=CERTAINTY,
                     config=BordaVotingConfig),
        StrategySpec("mbr_chrf", "MBR with chrF", mbr(chrf), extracts=True, pooled=True, config=MBRConfig),
        StrategySpec("mbr_bleu", "MBR with BLEU", mbr(bleu), extracts=True, pooled=True, config=MBRConfig),
        StrategySpec("mbr_edit", "MBR with edit similarity", mbr(edit_similarity), extracts=True, pooled=True,
                     config=MBRConfig),
        StrategySpec("mbr_embedding", "MBR with MiniLM embedding cosine", mbr(embedding_cosine), extracts=True, pooled=True,
                     config=MBRConfig),
        StrategySpec("self_refine", "draft + (n - 1) critique/revision rounds", self_refine, extracts=True, pooled=False,
                     budget="rounds", config=SelfRefineConfig,
                     set_by_run=frozenset({"rounds", "draft_params", "critique_params", "revision_params"})),
        StrategySpec("chain_of_thought", "reason step by step, then a call for the final answer",
                     chain(chain_programs.chain_of_thought), pooled=False, budget="none", needs=CONTINUATION,
                     config=ChainConfig, **UNCONSTRAINED_CHAIN),
        StrategySpec("self_ask", "follow-up questions answered by the model, then the answer",
                     chain(chain_programs.self_ask), pooled=False, budget="none", needs=CONTINUATION, config=ChainConfig,
                     **UNCONSTRAINED_CHAIN),
        StrategySpec("calculator", "inline <<calculator>> calls while solving",
                     chain(chain_programs.calculator_chain), pooled=False, budget="none", needs=CONTINUATION, config=ChainConfig,
                     **UNCONSTRAINED_CHAIN),
        _tree_spec("best_of_n_value", "best of n samples by the value (--value; pooled with --value tests: "
                   "the share of a code prompt's docstring examples passed)", step_beam_search.step_beam_search,
                   step_beam_search.StepBeamConfig,
                   lambda n, params: {"beam_width": 1, "expansions": n, "max_steps": 1,
                                      "step": whole_answer_step(params)},
                   {"beam_width", "expansions", "max_steps"}, fixed_step=True, whole_answer=True),
        _tree_spec("step_beam", "step-level beam search: n children per depth, n/4 kept (--value)",
                   step_beam_search.step_beam_search, step_beam_search.StepBeamConfig,
                   lambda n, params: {"beam_width": kept(n), "expansions": n // kept(n)}, {"beam_width", "expansions"}),
        _tree_spec("dvts", "diverse verifier tree search: n/4 subtrees, 4 children each (--value)",
                   dvts.dvts, dvts.DVTSConfig,
                   lambda n, params: {"subtrees": kept(n), "expansions": n // kept(n)}, {"subtrees", "expansions"}),
        _tree_spec("rebase", "REBASE: width n shared by softmax of values (--value)", rebase.rebase,
                   rebase.RebaseConfig, lambda n, params: {"width": n}, {"width"}),
        _tree_spec("mcts", "MCTS: n iterations of 4 children, value leaf evaluation (--value)", mcts.mcts,
                   mcts.MCTSConfig, lambda n, params: {"iterations": n}, {"iterations"},
                   defaults={"expansions": 4}.items()),
        _tree_spec("astar", "A*-decoding: n expansions of 4 children (--value)", astar.astar, astar.AStarConfig,
                   lambda n, params: {"max_expansions": n}, {"max_expansions"}, defaults={"expansions": 4}.items()),
        _tree_spec("particle_filter", "particle filtering with n particles (--value)",
                   particle_filter.particle_filter, particle_filter.ParticleFilterConfig,
                   lambda n, params: {"particles": n}, {"particles"}),
        _tree_spec("blockwise_cd", "blockwise controlled decoding: best of n blocks of 16 tokens (--value)",
                   blockwise_cd.blockwise_cd, blockwise_cd.BlockwiseCDConfig, lambda n, params: {"blocks": n},
                   {"blocks"}, fixed_step=True, defaults={"block_tokens": BLOCK_TOKENS}.items()),
        StrategySpec("tokenwise_cd", "tokenwise controlled decoding over the top n tokens, strength 4 (--value)",
                     tokenwise_cd, pooled=False, uses_value=True,
                     needs=frozenset({caps.LOCAL_CACHE}), why=TOKENWISE_WHY, config=TokenwiseCDConfig,
                     set_by_run=frozenset({"n", "top_k", "params"}), defaults=(("strength", LAMBDA),)),
    )
}


def check_options(names, options: StrategyOptions) -> None:
    """ValueError when a value or step delimiter is given but none of the strategies reads it, or
    a whole-answer value is given to a search that values partial solutions."""
    if value_scores_whole_answers(options):
        partial = [name for name in names if get_strategy(name).uses_value and not get_strategy(name).whole_answer]
        if partial:
            raise ValueError(f"value={options.value!r} scores whole answers only, but {', '.join(partial)} value "
                             "partial solutions; use it with best_of_n_value")
    if any(get_strategy(name).uses_value for name in names):
        return
    if options.value is not None:
        raise ValueError(f"value={options.value!r} is given, but no chosen strategy uses a value "
                         "(tree searches, controlled decoding, best_of_n_value do)")
    if options.step_delimiter != "\n":
        raise ValueError(f"step_delimiter={options.step_delimiter!r} is given, but no chosen strategy uses steps")
    if options.aggregation != "best":
        raise ValueError(f"aggregation={options.aggregation!r} is given, but no chosen strategy is a tree search")


def get_strategy(name: str) -> StrategySpec:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"strategy={name!r} is not known; choose from {', '.join(STRATEGIES)}") from None


def default_params() -> SamplingParams:
    return SamplingParams(temperature=0.8, max_tokens=256)
