"""Strategies by name, for the command line and the evaluation harness.

Each entry runs one strategy with n samples (or n rounds) on a `Generator`:

    spec = STRATEGIES["weighted_voting"]
    result = spec.run(generator, prompt, n, params, options, rng)
    n, options, overrides = spec.parse({"n": 8, "exp_scores": True})   # options by name, validated
    result = spec.run(generator, prompt, n, params, options, rng, overrides)

config: the strategy's own config dataclass; its options (`spec.fields()`) are read from it
(`strategies/options.py`): its scalar fields, minus those the runner sets (`set_by_run`: the
request's params, the fields n sets), plus n and, for value-guided ones, value. The options every
runner reads (pattern, math, value, step_delimiter, aggregation, answer_field) travel in
`StrategyOptions` (one set for all the strategies of an evaluation); the others are applied to
the built config as overrides (`options.configure`), over the registry's own `defaults`.

pooled: the strategy picks or builds its output from n i.i.d. samples of the prompt drawn in
one `generate` call, so the harness can evaluate it at every n by subsampling one stored pool.
budget: what n means for the strategy ("samples", "rounds", or "none" when it takes n = 1 only).
needs: the generator capabilities it reads (`metagen.decoding.capabilities`); needs_any: sets of
which the generator must have one in full (tree searches run on a local cache or on a server's
step continuations); `spec.run` checks them first (`spec.check`), so a backend that cannot run a strategy is refused before any
request is sent, with a message naming the strategy, the capability and what provides it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.strategies.options import OptionField, check_value, config_fields, configure


@dataclass(frozen=True)
class StrategyOptions:
    """pattern: answer regex (None: default extraction); math: compare answers with math-verify;
    value: what guides tree search, controlled decoding and best_of_n_value — "steps" (the
    exact arithmetic step verifier, min over steps) or the path of a trained value head;
    step_delimiter: the text that ends a reasoning step; aggregation: how tree searches pick
    among their finished leaves (best value, majority vote, value-weighted vote); answer_field:
    the answer is the value at this path of a JSON output ("answer", "result.value"; instead of
    pattern), for voting over a field of a structured output."""

    pattern: str | None = None
    math: bool = True
    value: str | None = None
    step_delimiter: str = "\n"
    aggregation: str = "best"
    answer_field: str | None = None

    def __post_init__(self) -> None:
        from metagen.scoring.answers import check_answer_field

        check_answer_field(self.pattern, self.answer_field)
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as error:
                raise ValueError(f"pattern={self.pattern!r} is not a valid regular expression ({error})") from None


_SHARED_DEFAULTS = {field.name: field.default for field in fields(StrategyOptions)}  # options every runner reads
DEFAULT_N = 8  # the budget when none is given


def value_is_head(options: StrategyOptions) -> bool:
    """The value is a trained value head file (it reads hidden states), not "steps" / "judge"."""
    return options.value is not None and options.value not in ("steps", "judge")


@dataclass(frozen=True)
class StrategySpec:
    """runner(generator, prompt, n, params, options, rng) -> StrategyResult; call it via `run`."""

    name: str
    description: str
    runner: Callable
    pooled: bool
    budget: str = "samples"
    uses_value: bool = False  # reads StrategyOptions.value / step_delimiter
    samples: bool = True  # draws at the given temperature (False: greedy, sampling options have no effect)
    needs: frozenset[str] = frozenset()  # generator capabilities it reads, whatever the options
    needs_any: tuple[frozenset[str], ...] = ()  # and one of these in full (empty: no alternatives)
    why: str = ""  # why it needs them, added to a refusal
    constrains: bool = True  # honours params.structured_outputs on its outputs
    why_unconstrained: str = ""  # when it cannot: why, for the refusal
    config: str | None = None  # "module:Class" of its own config dataclass: its scalar fields are its options
    set_by_run: frozenset[str] = frozenset({"n", "params"})  # config fields the runner sets (from n, the request)
    extracts: bool = False  # the runner extracts each candidate's answer itself (reads pattern, answer_field)
    defaults: tuple[tuple[str, object], ...] = ()  # its own defaults for config fields, over the config's

    def config_class(self) -> type | None:
        """Its config dataclass (imported on first use: the registry itself stays light)."""
        if self.config is None:
            return None
        module, _, name = self.config.partition(":")
        return getattr(importlib.import_module(module), name)

    def fields(self) -> dict[str, OptionField]:
        """Every option this strategy accepts, by name: `n` (its budget), the configurable fields
        of its config dataclass that the runner does not set itself (`set_by_run`), and `value`
        for a value-guided one (the value is an object, not a config field)."""
        found = {"n": OptionField("n", int, False, 1 if self.budget == "none" else DEFAULT_N, ())}
        config = self.config_class()
        if config is not None:
            for name, field in config_fields(config).items():
                if field.path[0] not in self.set_by_run:
                    shared = config_fields(StrategyOptions).get(name)  # read from StrategyOptions: its type, default
                    found[name] = field if shared is None else replace(shared, path=field.path)
            for name, value in self.defaults:
                found[name] = replace(found[name], default=value)
        if self.extracts:
            shared = config_fields(StrategyOptions)
            found.update({name: replace(shared[name], path=()) for name in ("pattern", "answer_field")})
        if self.uses_value:
            found["value"] = replace(config_fields(StrategyOptions)["value"], path=())
        return found

    def parse(self, given: Mapping[str, object], where: str = "") -> tuple[int, StrategyOptions, dict]:
        """(n, StrategyOptions, config overrides) from a mapping of option name -> value; ValueError
        naming the field (prefixed by `where`, e.g. "metagen.") when it is unknown to this strategy,
        of the wrong type, or out of range (the config dataclass's own checks)."""
        accepted = self.fields()
        for name, value in given.items():
            if name not in accepted:
                allowed = ", ".join(field.describe() for field in accepted.values())
                raise ValueError(f"{where}{name} is not an option of strategy {self.name!r}; it accepts: {allowed}")
            check_value(accepted[name], value, where + name)
        n = given.get("n", accepted["n"].default)
        try:
            self.check_n(n)
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        shared = {name: value for name, value in given.items() if name in _SHARED_DEFAULTS}
        overrides = {name: value for name, value in given.items() if name not in _SHARED_DEFAULTS and name != "n"}
        try:
            options = StrategyOptions(**shared)
            config = self.config_class()
            if config is not None:
                present = {name for name in config_fields(config)}
                configure(config(), {**{k: v for k, v in shared.items() if k in present}, **overrides})
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        return n, options, overrides

    def required(self, options: StrategyOptions, params: SamplingParams | None = None) -> frozenset[str]:
        """The capabilities this strategy needs with `options` and `params`: `needs`, plus
        HIDDEN_STATES when a value-guided strategy is given a trained value head, plus
        STRUCTURED_OUTPUT when the params carry a constraint."""
        needs = self.needs
        if self.uses_value and value_is_head(options):
            needs = needs | {caps.HIDDEN_STATES}
        if params is not None and params.structured_outputs is not None:
            needs = needs | {caps.STRUCTURED_OUTPUT}
        return needs

    def check(self, generator, options: StrategyOptions, params: SamplingParams | None = None) -> None:
        """ValueError naming this strategy, each capability it needs with `options` and `params`
        that `generator` lacks, and what would provide it; a constraint on a strategy that cannot
        apply one (chains) is refused by name."""
        what = f"strategy {self.name!r}"
        if params is not None and params.structured_outputs is not None and not self.constrains:
            raise ValueError(f"{what} cannot honour structured_outputs: {self.why_unconstrained}")
        try:
            caps.require(self.required(options, params), generator, what)
            caps.require_any(self.needs_any, generator, what)
        except ValueError as error:
            if not self.why:
                raise
            raise ValueError(f"{error}: {self.why}") from None

    def supported_by(self, generator, options: StrategyOptions | None = None,
                     params: SamplingParams | None = None) -> bool:
        """Whether `generator` has what this strategy needs with `options` and `params`."""
        options = options or StrategyOptions()
        if params is not None and params.structured_outputs is not None and not self.constrains:
            return False
        return not caps.missing(self.required(options, params), generator) and (
            not self.needs_any or any(not caps.missing(needs, generator) for needs in self.needs_any))

    def run(self, generator, prompt, n: int, params: SamplingParams, options: StrategyOptions, rng,
            overrides: Mapping[str, object] | None = None):
        """Check the generator's capabilities (before any request), then run the strategy;
        `overrides`: values of its config fields (from `parse`), over the runner's own."""
        self.check(generator, options, params)
        return self.runner(generator, prompt, n, params, options, rng, {**dict(self.defaults), **(overrides or {})})

    def check_n(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"n={n} is out of range: must be >= 1")
        if self.budget == "none" and n != 1:
            raise ValueError(f"n={n} is out of range for strategy {self.name!r}: it takes n=1 only")


def _with_answers(result, options: StrategyOptions):
    """Fill in each candidate's extracted answer (for strategies that do not extract one)."""
    from metagen.scoring.answers import extract_answer

    for candidate in result.candidates:
        candidate.answer = extract_answer(candidate.text, options.pattern, options.answer_field)
    return result


def _greedy(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.result import StrategyResult, candidates_from

    result = generator.generate(prompt, replace(params, temperature=0.0, n=1), generator=rng)
    candidates = candidates_from(result)
    return _with_answers(StrategyResult(candidates[0], candidates, result.cost), options)


def _best_of_n(scorer_name):
    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring import logprob
        from metagen.strategies.best_of_n import BestOfNConfig, best_of_n

        config = configure(BestOfNConfig(n, params), overrides)
        result = best_of_n(generator, prompt, config, getattr(logprob, scorer_name), rng=rng)
        return _with_answers(result, options)

    return run


def _self_consistency(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency

    config = SelfConsistencyConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return self_consistency(generator, prompt, configure(config, overrides), rng=rng)


def _weighted_voting(generator, prompt, n, params, options, rng, overrides):
    from metagen.scoring.logprob import self_certainty
    from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

    config = WeightedVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return weighted_voting(generator, prompt, configure(config, overrides), self_certainty, rng=rng)


def _borda(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.borda_voting import BordaVotingConfig, borda_voting

    config = BordaVotingConfig(n, params, options.pattern, options.math, answer_field=options.answer_field)
    return borda_voting(generator, prompt, configure(config, overrides), rng=rng)


def _mbr(utility_name):
    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring import embeddings, utilities
        from metagen.strategies.mbr import MBRConfig, mbr

        module = embeddings if utility_name == "EmbeddingCosine" else utilities
        utility = getattr(module, utility_name)()
        result = mbr(generator, prompt, configure(MBRConfig(n, params, include_self=True), overrides), utility, rng=rng)
        return _with_answers(result, options)

    return run


def _self_refine(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.self_refine import SelfRefineConfig, self_refine

    # The answers (draft, revisions) keep the request's constraint; a critique is free text.
    critique = replace(params, structured_outputs=None)
    config = SelfRefineConfig(rounds=n - 1, draft_params=params, critique_params=critique, revision_params=params)
    result = self_refine(generator, prompt, configure(config, overrides), rng=rng)
    return _with_answers(result, options)


def _chain(program_name):
    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.scoring.base import prompt_text
        from metagen.strategies import chain_programs
        from metagen.strategies.chain import ChainConfig

        config = configure(ChainConfig(params=replace(params, n=1)), overrides)
        return getattr(chain_programs, program_name)(generator, prompt_text(prompt), config, rng=rng)

    return run


def _tree(module: str, budget: Callable[[int, SamplingParams], dict], fixed_step: bool = False):
    """The runner of tree search `metagen.strategies.tree.<module>.<module>`; budget(n, params):
    the config fields n sets; fixed_step: the runner sets `step` itself (not the step delimiter)."""

    def run(generator, prompt, n, params, options, rng, overrides):
        from metagen.strategies.tree.expand import StepConfig
        from metagen.strategies.tree.runner import run_search

        search = importlib.import_module(f"metagen.strategies.tree.{module}")
        config_class = getattr(search, TREE_CONFIGS[module])
        params = replace(params, n=1)
        common = {"params": params, "pattern": options.pattern, "answer_field": options.answer_field,
                  "math": options.math, "aggregation": options.aggregation}
        if not fixed_step:
            common["step"] = StepConfig(options.step_delimiter, 64)
        config = configure(config_class(**common, **budget(n, params)), overrides)
        return run_search(getattr(search, module), config, generator, prompt, options, rng)

    return run


def _tokenwise_cd(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd
    from metagen.strategies.tree.runner import run_search

    params = replace(params, n=1)
    config = TokenwiseCDConfig(n=1, top_k=n, params=params, pattern=options.pattern, answer_field=options.answer_field)
    return run_search(tokenwise_cd, configure(config, overrides), generator, prompt, options, rng, local_only=True)


LAMBDA = 4.0  # tokenwise_cd's default strength
BLOCK_TOKENS = 16  # blockwise_cd's default block length
TREE_CONFIGS = {"step_beam_search": "StepBeamConfig", "dvts": "DVTSConfig", "rebase": "RebaseConfig",
                "mcts": "MCTSConfig", "astar": "AStarConfig", "particle_filter": "ParticleFilterConfig",
                "blockwise_cd": "BlockwiseCDConfig"}


def _kept(n: int) -> int:
    return max(1, n // 4)


def _tree_spec(name, description, module, budget, set_by_run, fixed_step=False, defaults=()):
    """A value-guided tree search over a local cache or a server's step continuations."""
    return StrategySpec(name, description, _tree(module, budget, fixed_step), pooled=False, uses_value=True,
                        defaults=tuple(defaults),
                        needs_any=SEARCH, config=f"metagen.strategies.tree.{module}:{TREE_CONFIGS[module]}",
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

S = "metagen.strategies."

STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        StrategySpec("greedy", "one greedy (temperature 0) completion", _greedy, extracts=True, pooled=False, budget="none",
                     samples=False),
        StrategySpec("best_of_n", "best of n samples by self-certainty", _best_of_n("self_certainty"), extracts=True, pooled=True,
                     needs=CERTAINTY, config=S + "best_of_n:BestOfNConfig"),
        StrategySpec("best_of_n_logprob", "best of n samples by mean token logprob", _best_of_n("mean_logprob"),
                     extracts=True, pooled=True, needs=frozenset({caps.LOGPROBS}), config=S + "best_of_n:BestOfNConfig"),
        StrategySpec("self_consistency", "majority vote over extracted answers", _self_consistency, pooled=True,
                     config=S + "self_consistency:SelfConsistencyConfig"),
        StrategySpec("weighted_voting", "answers weighted by self-certainty", _weighted_voting, pooled=True,
                     needs=CERTAINTY, defaults=(("exp_scores", False),), config=S + "weighted_voting:WeightedVotingConfig"),
        StrategySpec("borda", "Borda voting ranked by self-certainty, p = 0.5", _borda, pooled=True, needs=CERTAINTY,
                     config=S + "borda_voting:BordaVotingConfig"),
        StrategySpec("mbr_chrf", "MBR with chrF", _mbr("ChrF"), extracts=True, pooled=True, config=S + "mbr:MBRConfig"),
        StrategySpec("mbr_bleu", "MBR with BLEU", _mbr("Bleu"), extracts=True, pooled=True, config=S + "mbr:MBRConfig"),
        StrategySpec("mbr_edit", "MBR with edit similarity", _mbr("EditSimilarity"), extracts=True, pooled=True,
                     config=S + "mbr:MBRConfig"),
        StrategySpec("mbr_embedding", "MBR with MiniLM embedding cosine", _mbr("EmbeddingCosine"), extracts=True, pooled=True,
                     config=S + "mbr:MBRConfig"),
        StrategySpec("self_refine", "draft + (n - 1) critique/revision rounds", _self_refine, extracts=True, pooled=False,
                     budget="rounds", config=S + "self_refine:SelfRefineConfig",
                     set_by_run=frozenset({"rounds", "draft_params", "critique_params", "revision_params"})),
        StrategySpec("chain_of_thought", "reason step by step, then a call for the final answer",
                     _chain("chain_of_thought"), pooled=False, budget="none", needs=CONTINUATION,
                     config=S + "chain:ChainConfig", **UNCONSTRAINED_CHAIN),
        StrategySpec("self_ask", "follow-up questions answered by the model, then the answer", _chain("self_ask"),
                     pooled=False, budget="none", needs=CONTINUATION, config=S + "chain:ChainConfig",
                     **UNCONSTRAINED_CHAIN),
        StrategySpec("calculator", "inline <<calculator>> calls while solving", _chain("calculator_chain"),
                     pooled=False, budget="none", needs=CONTINUATION, config=S + "chain:ChainConfig",
                     **UNCONSTRAINED_CHAIN),
        _tree_spec("best_of_n_value", "best of n samples by the value (--value)", "step_beam_search",
                   lambda n, params: {"beam_width": 1, "expansions": n, "max_steps": 1,
                                      "step": _whole_answer_step(params)},
                   {"beam_width", "expansions", "max_steps"}, fixed_step=True),
        _tree_spec("step_beam", "step-level beam search: n children per depth, n/4 kept (--value)", "step_beam_search",
                   lambda n, params: {"beam_width": _kept(n), "expansions": n // _kept(n)}, {"beam_width", "expansions"}),
        _tree_spec("dvts", "diverse verifier tree search: n/4 subtrees, 4 children each (--value)", "dvts",
                   lambda n, params: {"subtrees": _kept(n), "expansions": n // _kept(n)}, {"subtrees", "expansions"}),
        _tree_spec("rebase", "REBASE: width n shared by softmax of values (--value)", "rebase",
                   lambda n, params: {"width": n}, {"width"}),
        _tree_spec("mcts", "MCTS: n iterations of 4 children, value leaf evaluation (--value)", "mcts",
                   lambda n, params: {"iterations": n}, {"iterations"}, defaults={"expansions": 4}.items()),
        _tree_spec("astar", "A*-decoding: n expansions of 4 children (--value)", "astar",
                   lambda n, params: {"max_expansions": n}, {"max_expansions"}, defaults={"expansions": 4}.items()),
        _tree_spec("particle_filter", "particle filtering with n particles (--value)", "particle_filter",
                   lambda n, params: {"particles": n}, {"particles"}),
        _tree_spec("blockwise_cd", "blockwise controlled decoding: best of n blocks of 16 tokens (--value)",
                   "blockwise_cd", lambda n, params: {"blocks": n}, {"blocks"}, fixed_step=True,
                   defaults={"block_tokens": BLOCK_TOKENS}.items()),
        StrategySpec("tokenwise_cd", "tokenwise controlled decoding over the top n tokens, strength 4 (--value)",
                     _tokenwise_cd, pooled=False, uses_value=True,
                     needs=frozenset({caps.LOCAL_CACHE}), why=TOKENWISE_WHY, config=S + "tokenwise_cd:TokenwiseCDConfig",
                     set_by_run=frozenset({"n", "top_k", "params"}), defaults=(("strength", LAMBDA),)),
    )
}


def _whole_answer_step(params: SamplingParams):
    """best_of_n_value's one step: the whole answer (no delimiter, up to max_tokens)."""
    from metagen.strategies.tree.expand import StepConfig

    return StepConfig(None, params.max_tokens)


def check_options(names, options: StrategyOptions) -> None:
    """ValueError when a value or step delimiter is given but none of the strategies reads it."""
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
