"""What a strategy is to the registry: `StrategySpec` (its runner, what it needs from a generator,
its config dataclass and so its options) and `StrategyOptions` (the options every runner reads).

config: the strategy's own config dataclass; its options (`spec.fields()`) are the ones it
declares (`options.option`, `options.nested`; strategies/options.py), minus those the runner sets
(`set_by_run`: the request's params, the fields n sets), plus n and, for value-guided ones, value.
The options every runner reads (pattern, math, value, step_delimiter, aggregation, answer_field)
are declared once, in `StrategyOptions` (one set for all the strategies of an evaluation), and
the configs that have them reuse that declaration (`shared`); the others are applied to the built
config as overrides (`options.configure`), over the registry's own `defaults`.

pooled: the strategy picks or builds its output from n i.i.d. samples of the prompt drawn in
one `generate` call, so the harness can evaluate it at every n by subsampling one stored pool.
whole_answer: a value-guided strategy that values whole answers only (best_of_n_value): with a
value that reads an answer's text alone (`value_reads_text_alone`: the docstring examples, the
step verifier, a PRM) it is the argmax of that value over n i.i.d. samples, so it runs pooled
(`is_pooled(options)`), needing no search backend.
sequential: pooled, but it draws its samples over several `generate` calls (in rounds) and
may stop before n (adaptive self-consistency); the harness serves it a pool's samples in order,
one call after another (`PoolGenerator(sequential=True)`), and reports the mean it drew.
budget: what n means for the strategy ("samples", "rounds", or "none" when it takes n = 1 only).
needs: the generator capabilities it reads (`metagen.decoding.capabilities`); needs_any: sets of
which the generator must have one in full (tree searches run on a local cache or on a server's
step continuations); `spec.run` checks them first (`spec.check`), so a backend that cannot run a
strategy is refused before any request is sent, with a message naming the strategy, the
capability and what provides it. option_needs: capabilities an option's value adds (in-context
navigation's selection="likelihood" or a passage: the local model), read from the config overrides
`run` is given, so `run` refuses such a request before any call too. For a pooled strategy
`needs` is also all its stored samples must carry: empty (voting, MBR: text only) runs on any
server, token ids or not.

Each strategy is registered where its config is defined, by a `register(StrategySpec(...),
__name__)` line at the end of that module (runners.py for greedy, which has no config);
registry.py finds those modules by that line, imports them and reads the table (`registered`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.strategies.options import Option, check_options, check_value, check_work, config_options, configure, \
    option, reuse

AGGREGATIONS = ("best", "majority", "weighted")  # how a tree search picks among its leaves (tree/leaves.py)


@dataclass(frozen=True)
class StrategyOptions:
    """pattern: answer regex (None: default extraction); math: compare answers with math-verify;
    value: what guides tree search, controlled decoding and best_of_n_value — "steps" (the
    exact arithmetic step verifier, min over steps), "judge", a process reward model
    ("prm:PATH", "reward:URL"; scoring/step_prm.py), "tests" (best_of_n_value only: the share of
    a code prompt's docstring examples a whole answer passes) or the path of a trained value head;
    step_delimiter: the text that ends a reasoning step; aggregation: how tree searches pick
    among their finished leaves (best value, majority vote, value-weighted vote); answer_field:
    the answer is the value at this path of a JSON output ("answer", "result.value"; instead of
    pattern), for voting over a field of a structured output; value_parameters: a served PRM's
    parameter count, so its FLOPs (2·N per token read) are known and join the generator's.

    Declared here once because one option serves several configs: a config that has one reuses
    this declaration (`shared`), so its kind, default and range are these (math True as in every
    voting config; StepConfig declares its own step_delimiter, where None is also allowed, with
    this default; tests/strategies/test_options.py keeps them equal); the runner passes these
    values."""

    pattern: str | None = option(None, str, "answer regex (default: boxed / 'answer is' / last number)",
                                 optional=True)
    math: bool = option(True, bool, "compare answers with math-verify (0.5, 1/2 and \\frac{1}{2} are one "
                        "answer); false: as strings")
    value: str | None = option(None, str, "value guiding tree search / controlled decoding: steps | judge | "
                               "prm:PATH | reward:URL | a value-head file | tests (best_of_n_value on code: the "
                               "docstring examples passed)", optional=True)
    step_delimiter: str = option("\n", str, "text that ends a reasoning step")
    aggregation: str = option("best", str, "tree search: pick the leaf of best value, or vote over the leaves' "
                              "answers (majority, value-weighted)", choices=AGGREGATIONS)
    answer_field: str | None = option(None, str, "the answer is this field of a JSON output (e.g. 'answer' or "
                                      "'result.value'), instead of pattern", optional=True)
    value_parameters: float | None = option(None, float, "a served PRM's (--value reward:URL) parameters a token "
                                            "runs through, for its FLOPs (2 x N per token read; default unknown)",
                                            optional=True, above=0)

    def __post_init__(self) -> None:
        from metagen.scoring.answers import check_answer_field
        from metagen.scoring.step_prm import parse_prm_spec

        check_options(self)
        check_answer_field(self.pattern, self.answer_field)  # pattern: compiled by RE2 (linear-time matching)
        prm = parse_prm_spec(self.value)
        if self.value_parameters is not None and (prm is None or prm[0] != "remote"):
            raise ValueError(f"value_parameters={self.value_parameters} applies to a served PRM (--value reward:URL "
                             f"or reward-shepherd:URL), not to value={self.value!r} (a local one's are counted)")


SHARED = config_options(StrategyOptions)  # the options every runner reads, by name


def shared(name: str):
    """A config field declared by the shared option `name` of `StrategyOptions` (`options.reuse`)."""
    return reuse(SHARED[name])


DEFAULT_N = 8  # the budget when none is given
BUDGET_HELP = {"samples": "the budget: samples drawn (or branches, for a search)",
               "rounds": "the budget: rounds (attempts) at most", "none": "the budget: 1 (a single output)"}


# values that score finished answers only: "tests" runs a code problem's program on its
# docstring's examples (`scoring/example_tests.py`), score = share passed
WHOLE_ANSWER_VALUES = ("tests",)


def value_is_head(options: StrategyOptions) -> bool:
    """The value is a trained value head file (it reads hidden states), not "steps" / "judge" /
    a process reward model ("prm:PATH", "reward:URL", ...: they read the steps' text) or a
    whole-answer value."""
    from metagen.scoring.step_prm import is_prm_spec

    return (options.value is not None and options.value not in ("steps", "judge", *WHOLE_ANSWER_VALUES)
            and not is_prm_spec(options.value))


def value_scores_whole_answers(options: StrategyOptions) -> bool:
    """The value scores finished answers only (`WHOLE_ANSWER_VALUES`), not partial solutions."""
    return options.value in WHOLE_ANSWER_VALUES


def value_reads_text_alone(options: StrategyOptions) -> bool:
    """The value scores an answer from its text alone, calling no generator and reading no
    hidden state: the docstring examples ("tests"), the arithmetic step verifier ("steps") or a
    process reward model (prm:PATH, reward:URL, ...). best_of_n_value then values n finished
    samples drawn in one call, so the harness evaluates it from a pool (`StrategySpec.is_pooled`);
    "judge" (the generator judges each step) and a value head (hidden states) run it as a search."""
    from metagen.scoring.step_prm import is_prm_spec

    value = options.value
    return value in (*WHOLE_ANSWER_VALUES, "steps") or (value is not None and is_prm_spec(value))


@dataclass(frozen=True)
class StrategySpec:
    """runner(generator, prompt, n, params, options, rng) -> GenerationResult; call it via `run`."""

    name: str
    description: str
    runner: Callable
    pooled: bool
    sequential: bool = False  # pooled, drawing its samples in several calls (see the module)
    budget: str = "samples"
    uses_value: bool = False  # reads StrategyOptions.value / step_delimiter
    whole_answer: bool = False  # values whole answers only: pooled with a whole-answer value (see the module)
    samples: bool = True  # draws at the given temperature (False: greedy, sampling options have no effect)
    needs: frozenset[str] = frozenset()  # generator capabilities it reads, whatever the options
    needs_any: tuple[frozenset[str], ...] = ()  # and one of these in full (empty: no alternatives)
    why: str = ""  # why it needs them, added to a refusal
    constrains: bool = True  # honours params.structured_outputs on its outputs
    why_unconstrained: str = ""  # when it cannot: why, for the refusal
    config: type | None = None  # its own config dataclass: the options it declares are the strategy's
    set_by_run: frozenset[str] = frozenset({"n", "params"})  # config fields the runner sets (from n, the request)
    extracts: bool = False  # the runner extracts each candidate's answer itself (reads pattern, answer_field)
    votes: bool = False  # picks by a vote over answers extracted from the text (meaningless for programs)
    defaults: tuple[tuple[str, object], ...] = ()  # its own defaults for config fields, over the config's
    # (option, values, capabilities): needed too when the option is one of values (None: set, not None)
    option_needs: tuple[tuple[str, tuple | None, frozenset[str]], ...] = ()
    required_options: tuple[str, ...] = ()  # must be given: no default makes sense (the corpus to search)

    def is_pooled(self, options: StrategyOptions) -> bool:
        """Whether the harness evaluates it from a sample pool with these options: `pooled`, or a
        `whole_answer` strategy given a value that reads an answer's text alone
        (`value_reads_text_alone`)."""
        return self.pooled or (self.whole_answer and value_reads_text_alone(options))

    def _needs_any(self, options: StrategyOptions) -> tuple[frozenset[str], ...]:
        """needs_any, unless it runs pooled from plain samples (`is_pooled` by its value)."""
        return () if not self.pooled and self.is_pooled(options) else self.needs_any

    def config_class(self) -> type | None:
        """Its config dataclass (a strategy module imports no torch, so the table stays light)."""
        return self.config

    def fields(self) -> dict[str, Option]:
        """Every option this strategy accepts, by name: `n` (its budget), the options its config
        dataclass declares that the runner does not set itself (`set_by_run`; a shared one as
        `StrategyOptions` declares it), with the registry's `defaults`, and `value` for a
        value-guided one (the value is an object, not a config field)."""
        found = {"n": Option(int, 1 if self.budget == "none" else DEFAULT_N, BUDGET_HELP[self.budget], low=1,
                             sizes_work=True, name="n")}
        config = self.config_class()
        if config is not None:
            for name, declared in config_options(config).items():
                if declared.path[0] not in self.set_by_run:
                    found[name] = declared if name not in SHARED else replace(SHARED[name], path=declared.path)
            for name, value in self.defaults:
                found[name] = replace(found[name], default=value)
        if self.extracts:
            found.update({name: SHARED[name] for name in ("pattern", "answer_field")})
        if self.uses_value:
            found["value"] = SHARED["value"]
        return found

    def parse(self, given: Mapping[str, object], where: str = "", *, max_n: int | None = None,
              limit_name: str = "max_n") -> tuple[int, StrategyOptions, dict]:
        """(n, StrategyOptions, config overrides) from a mapping of option name -> value; ValueError
        naming the option (prefixed by `where`, e.g. "metagen.") when it is unknown to this strategy,
        of the wrong kind or out of its declared range (`options.check_value`), or refused by a
        check between the config's fields. max_n: the bound
        on n and on every option that counts work (`options.check_work`; None: no bound), checked
        before anything is built; limit_name: how the message names it (a server's "--max-n")."""
        accepted = self.fields()
        for name in given:
            if name not in accepted:
                allowed = ", ".join(field.describe() for field in accepted.values())
                raise ValueError(f"{where}{name} is not an option of strategy {self.name!r}; it accepts: {allowed}")
        if max_n is not None:  # first: the bound the server sets says more than an option's own range
            check_work(accepted, given, max_n, where, limit_name)
        for name, value in given.items():
            check_value(accepted[name], value, where + name)
        n = given.get("n", accepted["n"].default)
        try:
            self.check_n(n)
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        for name in self.required_options:
            if given.get(name) is None:
                raise ValueError(f"{where}{name} is required by strategy {self.name!r}: {accepted[name].help}")
        shared = {name: value for name, value in given.items() if name in SHARED}
        overrides = {name: value for name, value in given.items() if name not in SHARED and name != "n"}
        try:
            options = StrategyOptions(**shared)
            config = self.config_class()
            if config is not None:
                present = config_options(config)
                configure(config(), {**{k: v for k, v in shared.items() if k in present}, **overrides})
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        return n, options, overrides

    def required(self, options: StrategyOptions, params: SamplingParams | None = None,
                 overrides: Mapping[str, object] | None = None) -> frozenset[str]:
        """The capabilities this strategy needs with `options`, `params` and its config
        `overrides`: `needs`, plus those of `option_needs` whose option (as overridden, else its
        default) has a listed value, plus HIDDEN_STATES when a value-guided strategy is given a
        trained value head, plus STRUCTURED_OUTPUT when the params carry a constraint."""
        needs = self.needs
        if self.option_needs:
            accepted, given = self.fields(), {**dict(self.defaults), **(overrides or {})}
            for name, values, extra in self.option_needs:
                value = given.get(name, accepted[name].default)
                if (value is not None) if values is None else value in values:
                    needs = needs | extra
        if self.uses_value and value_is_head(options):
            needs = needs | {caps.HIDDEN_STATES}
        if params is not None and params.structured_outputs is not None:
            needs = needs | {caps.STRUCTURED_OUTPUT}
        return needs

    def check(self, generator, options: StrategyOptions, params: SamplingParams | None = None,
              overrides: Mapping[str, object] | None = None) -> None:
        """ValueError naming this strategy, each capability it needs with `options` and `params`
        that `generator` lacks, and what would provide it; a constraint on a strategy that cannot
        apply one (chains) is refused by name."""
        what = f"strategy {self.name!r}"
        if params is not None and params.structured_outputs is not None and not self.constrains:
            raise ValueError(f"{what} cannot honour structured_outputs: {self.why_unconstrained}")
        try:
            caps.require(self.required(options, params, overrides), generator, what)
            caps.require_any(self._needs_any(options), generator, what)
        except ValueError as error:
            if not self.why:
                raise
            raise ValueError(f"{error}: {self.why}") from None

    def supported_by(self, generator, options: StrategyOptions | None = None,
                     params: SamplingParams | None = None, overrides: Mapping[str, object] | None = None) -> bool:
        """Whether `generator` has what this strategy needs with `options` and `params`."""
        options = options or StrategyOptions()
        if params is not None and params.structured_outputs is not None and not self.constrains:
            return False
        needs_any = self._needs_any(options)
        return not caps.missing(self.required(options, params, overrides), generator) and (
            not needs_any or any(not caps.missing(needs, generator) for needs in needs_any))

    def run(self, generator, prompt, n: int, params: SamplingParams, options: StrategyOptions, rng,
            overrides: Mapping[str, object] | None = None):
        """Check the generator's capabilities (before any request), then run the strategy;
        `overrides`: values of its config fields (from `parse`), over the runner's own."""
        self.check(generator, options, params, overrides)
        return self.runner(generator, prompt, n, params, options, rng, {**dict(self.defaults), **(overrides or {})})

    def check_n(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"n={n} is out of range: must be >= 1")
        if self.budget == "none" and n != 1:
            raise ValueError(f"n={n} is out of range for strategy {self.name!r}: it takes n=1 only")


# capability sets several entries share
CERTAINTY = frozenset({caps.FULL_DISTRIBUTIONS})  # self-certainty reads every next-token distribution
# searches extend partial solutions step by step: from the model's cache, or by a server
# continuing the prefix to the step delimiter
SEARCH = (frozenset({caps.LOCAL_CACHE}), frozenset({caps.STEP_CONTINUATION}))

_REGISTERED: dict[str, dict[str, StrategySpec]] = {}  # module -> name -> spec, in registration order


def register(spec: StrategySpec, module: str) -> StrategySpec:
    """Add `spec` to the table under `module` (the module defining its config: `__name__`);
    ValueError when another module registered its name. Registering a name again from the same
    module replaces it (a reloaded module)."""
    for other, specs in _REGISTERED.items():
        if other != module and spec.name in specs:
            raise ValueError(f"strategy {spec.name!r} is registered by both {other} and {module}")
    _REGISTERED.setdefault(module, {})[spec.name] = spec
    return spec


def registered(module: str) -> list[StrategySpec]:
    """The strategies `module` registered, in order."""
    return list(_REGISTERED.get(module, {}).values())


def registering_modules() -> set[str]:
    """Every module that registered a strategy (registry.py checks it found them all)."""
    return set(_REGISTERED)
