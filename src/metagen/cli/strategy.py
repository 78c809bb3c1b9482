"""`metagen generate PROMPT --strategy NAME`: one meta-generation strategy on one prompt.

`--n` is the strategy's budget (samples or rounds, see `metagen eval --help`); every other option of
a strategy is a flag made from its declaration (`options.option` beside the strategy's config,
read through `StrategySpec.fields`; `add_strategy_options`): its help, kind, range or choices, its
default and the strategies that take it. The flag is `--name`, or `--strategy-name` when the name
is a sampling flag's (`SAMPLING_FLAGS`: rebase's `temperature` is `--strategy-temperature`, the
sampling flag keeps its name); tests/test_cli_strategy_options.py checks that no flag collides.
A flag the chosen strategy does not accept is refused by name. The options every runner reads
(`StrategyOptions`) have flags of their own (`add_shared_option`), from the same declarations. The
candidates are drawn by a `LocalGenerator`, a `SpeculativeGenerator` with --speculative, or the
remote generator of --backend (the strategy's capability check refuses what a server cannot do).
Prints the chosen text (and its answer), or with --json the chosen candidate, every candidate, the
votes and the cost.
"""

from __future__ import annotations

import argparse
import json

from metagen.cli import backend, common
from metagen.cli.sampling import FLOAT_PARAMS, INT_PARAMS, OTHER_OPTIONS, SAMPLING_ONLY, given
from metagen.strategies.spec import SHARED, StrategyOptions

# options with flags of their own in cli/generate.py (`add_shared_option`); their defaults
# (StrategyOptions', the one place they are declared) mean "not given"
HAND_WRITTEN = ("value", "step_delimiter", "aggregation", "answer_field")
# the sampling flags of `metagen generate`: a strategy option of one of these names is
# --strategy-NAME (the sampling flag keeps --NAME)
SAMPLING_FLAGS = frozenset(flag for flag, _ in FLOAT_PARAMS + INT_PARAMS) | frozenset(OTHER_OPTIONS)
_TAKERS_SHOWN = 4  # strategies named in a flag's help before "..."


def flag_of(name: str) -> str:
    """The flag of strategy option `name`: --name, or --strategy-name for a sampling flag's name."""
    flag = name.replace("_", "-")
    return "--" + ("strategy-" + flag if flag in SAMPLING_FLAGS else flag)


def strategy_options() -> dict[str, list[tuple[str, object]]]:
    """option name -> [(strategy, its Option), ...] over the whole registry, in registry order
    (`n` and the hand-written shared options left out)."""
    from metagen.strategies.registry import STRATEGIES

    found: dict[str, list[tuple[str, object]]] = {}
    for spec in STRATEGIES.values():
        for name, declared in spec.fields().items():
            if name != "n" and name not in HAND_WRITTEN:
                found.setdefault(name, []).append((spec.name, declared))
    return found


def _grouped(takers: list[tuple[str, object]], key) -> list[tuple[object, str]]:
    """[(value, "strategy, strategy, ...")] of the distinct key(Option) values, in order."""
    groups: dict = {}
    for strategy, declared in takers:
        groups.setdefault(key(declared), []).append(strategy)
    return [(value, ", ".join(names[:_TAKERS_SHOWN]) + (", ..." if len(names) > _TAKERS_SHOWN else ""))
            for value, names in groups.items()]


def option_help(takers: list[tuple[str, object]]) -> str:
    """A flag's help from the declarations of the strategies that take it: what it is (per
    strategy when they differ), its kind and range, its default (per strategy when they differ)."""
    first = takers[0][1]
    helps = _grouped(takers, lambda declared: declared.help)
    what = "; ".join(f"{text} ({names})" for text, names in helps)
    defaults = _grouped(takers, lambda declared: declared.default)
    default = (f"default {defaults[0][0]!r}" if len(defaults) == 1
               else "default " + ", ".join(f"{value!r} ({names})" for value, names in defaults))
    allowed = first.range_text()
    kind = first.kind.__name__ + ("" if not allowed else (", " if first.choices else " ") + allowed)
    return f"{what}; {kind}; {default}"


def add_strategy_options(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None,
                         note: str = "") -> None:
    """One flag per strategy option of the registry (`flag_of`, help from the declarations,
    `option_help`, then `note`), or of the options `names` only; default None = not given, the
    strategy's default applies."""
    group = parser.add_argument_group("strategy options (declared beside each strategy's config; see `--strategy`)")
    for name, takers in strategy_options().items():
        if names is not None and name not in names:
            continue
        declared = takers[0][1]
        if declared.kind is bool:
            how = {"action": argparse.BooleanOptionalAction}
        else:
            how = {"type": declared.kind if declared.kind is not str else _unescaped,
                   "metavar": declared.kind.__name__.upper(), "choices": declared.choices}
        group.add_argument(flag_of(name), dest="strategy_" + name, default=None, help=option_help(takers) + note,
                           **how)


def add_shared_option(parser, name: str, note: str = "", **how) -> None:
    """The flag --name of shared option `name` (`StrategyOptions`): its declared default, choices
    and help (+ `note`); `how`: argparse's type or metavar."""
    declared = SHARED[name]
    parser.add_argument("--" + name.replace("_", "-"), default=declared.default, choices=declared.choices,
                        help=declared.help + note, **how)


def _unescaped(text: str) -> str:
    from metagen.cli.args import unescape

    return unescape(text)


def strategy_options_given(args: argparse.Namespace) -> dict[str, object]:
    """The strategy options the command line set, by option name (hand-written flags included)."""
    options = {name: getattr(args, name) for name in HAND_WRITTEN
               if getattr(args, name) != getattr(StrategyOptions, name)}
    for name in strategy_options():
        value = getattr(args, "strategy_" + name, None)
        if value is not None:
            options[name] = value
    return options


def refuse_strategy_options(args: argparse.Namespace) -> None:
    """ValueError naming the strategy option flags given without --strategy."""
    set_flags = [flag_of(name) for name in strategy_options() if getattr(args, "strategy_" + name, None) is not None]
    if set_flags:
        raise ValueError(f"{', '.join(set_flags)} configure a strategy: they apply with --strategy only")


def generate_with_strategy(args: argparse.Namespace, params, speculative: dict | None) -> int:
    from dataclasses import replace

    from metagen.cli.args import chat_prompt
    from metagen.decoding import LocalGenerator
    from metagen.strategies.registry import check_options, get_strategy

    spec = get_strategy(args.strategy)
    if args.beam_width is not None:
        raise ValueError("--strategy cannot be combined with --beam-width")
    if args.logprobs is not None:
        raise ValueError("--logprobs applies to plain generation: a strategy's output has no per-token log-probabilities")
    if not spec.samples:
        unread = given(args, SAMPLING_ONLY)
        if unread:
            raise ValueError(f"strategy {spec.name!r} decodes greedily: {', '.join('--' + n for n in unread)} "
                             "would have no effect")
    budget = params.n
    spec.check_n(budget)
    chosen = strategy_options_given(args)
    check_options([spec.name], StrategyOptions(**{k: v for k, v in chosen.items() if k in HAND_WRITTEN}))
    _, options, overrides = spec.parse(chosen)
    prompt = chat_prompt(args)
    rng = replace(params, n=1).make_generator()
    if args.backend is not None:
        generator = backend.make_generator(args, chat=args.chat)
    else:
        model = common.load_model(args)
        if speculative is None:
            generator = LocalGenerator(model, chat=args.chat)
        else:
            from metagen.speculative import SpeculativeGenerator

            generator = SpeculativeGenerator.by_name(model, speculative["kind"], speculative["config"], args.chat,
                                                     **speculative["drafter_args"])
    try:
        result = spec.run(generator, prompt, budget, replace(params, n=1), options, rng, overrides)
    finally:
        if args.backend is not None:
            generator.close()
    if not args.json:
        print(result.chosen.text)
        if result.chosen.answer is not None:
            print(f"answer: {result.chosen.answer}")
        return _cut_exit_code(result)
    print(json.dumps({
        "strategy": spec.name,
        "n": budget,
        "chosen": {"text": result.chosen.text, "answer": result.chosen.answer, "score": result.chosen.score,
                   "complete": result.chosen.complete},
        "candidates": [
            {"text": c.text, "answer": c.answer, "score": c.score, "finish_reason": c.finish_reason,
             "tokens": None if c.token_ids is None else len(c.token_ids), "chosen": c is result.chosen,
             "complete": c.complete}
            for c in result.completions
        ],
        "incomplete": result.incomplete,
        "votes": result.votes,
        "cost": result.cost.to_dict(),
    }))
    return _cut_exit_code(result)


def _cut_exit_code(result) -> int:
    """0, or 3 with a line on stderr when the chosen output was cut before its constraint accepted
    it (every candidate was: a strategy never chooses a cut one over a complete one)."""
    if result.chosen.complete is not False:
        return 0
    import sys

    sys.stdout.flush()
    print(f"metagen: warning: all {len(result.completions)} candidates ended before the constraint accepted them: "
          "the chosen output is not valid (raise --max-tokens)", file=sys.stderr)
    return 3
