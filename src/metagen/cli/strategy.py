"""`metagen generate PROMPT --strategy NAME`: one meta-generation strategy on one prompt.

`--n` is the strategy's budget (samples or rounds, see `metagen eval --help`); every other option of
a strategy is a flag derived from its config dataclass (`StrategySpec.fields`, `add_strategy_options`):
`--temperature` of rebase's config is `--strategy-temperature` (the sampling flag keeps its name), and
a flag the chosen strategy does not accept is refused by name. The candidates are
drawn by a `LocalGenerator`, a `SpeculativeGenerator` with --speculative, or the remote generator of
--backend (the strategy's capability check refuses what a server cannot do). Prints the chosen text
(and its answer), or with --json the chosen candidate, every candidate, the votes and the cost.
"""

from __future__ import annotations

import argparse
import json

from metagen.cli import backend, common
from metagen.cli.sampling import SAMPLING_ONLY, given
from metagen.strategies.spec import StrategyOptions

# options with hand-written flags in cli/generate.py; their defaults (StrategyOptions', the one
# place they are written) mean "not given"
HAND_WRITTEN = ("value", "step_delimiter", "aggregation", "answer_field")


def _derived_options() -> dict[str, tuple[object, list[str]]]:
    """option name -> (its OptionField, the strategies taking it), over the whole registry."""
    from metagen.strategies.registry import STRATEGIES

    found: dict[str, tuple[object, list[str]]] = {}
    for spec in STRATEGIES.values():
        for name, field in spec.fields().items():
            if name == "n" or name in HAND_WRITTEN:
                continue
            found.setdefault(name, (field, []))[1].append(spec.name)
    return found


def add_strategy_options(parser: argparse.ArgumentParser) -> None:
    """One flag per strategy option of the registry (after every other flag): --name, or
    --strategy-name when --name is already another flag (a sampling flag: argparse refuses the
    second one); default None = not given, the strategy's default applies."""
    group = parser.add_argument_group("strategy options (from each strategy's config; see `--strategy`)")
    for name, (field, takers) in _derived_options().items():
        takers_text = ", ".join(takers) if len(takers) <= 4 else f"{', '.join(takers[:4])}, ..."
        text = f"{takers_text}: {field.kind.__name__} (default {field.default!r})"
        if field.kind is bool:
            how = {"action": argparse.BooleanOptionalAction}
        else:
            how = {"type": field.kind if field.kind is not str else _unescaped, "metavar": field.kind.__name__.upper()}
        flag = name.replace("_", "-")
        try:
            group.add_argument("--" + flag, dest="strategy_" + name, default=None, help=text, **how)
        except argparse.ArgumentError:  # --name is taken
            group.add_argument("--strategy-" + flag, dest="strategy_" + name, default=None, help=text, **how)


def _unescaped(text: str) -> str:
    from metagen.cli.args import unescape

    return unescape(text)


def strategy_options_given(args: argparse.Namespace) -> dict[str, object]:
    """The strategy options the command line set, by option name (hand-written flags included)."""
    options = {name: getattr(args, name) for name in HAND_WRITTEN 
               if getattr(args, name) != getattr(StrategyOptions, name)}
    for name in _derived_options():
        value = getattr(args, "strategy_" + name, None)
        if value is not None:
            options[name] = value
    return options


def refuse_strategy_options(args: argparse.Namespace) -> None:
    """ValueError naming the derived strategy flags given without --strategy."""
    set_flags = [name for name in _derived_options() if getattr(args, "strategy_" + name, None) is not None]
    if set_flags:
        raise ValueError(f"{', '.join(set_flags)} configure a strategy: they apply with --strategy only")


def generate_with_strategy(args: argparse.Namespace, params, speculative: dict | None) -> int:
    from dataclasses import replace

    from metagen.cli.args import chat_prompt
    from metagen.cli.speculative import make_drafter
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

            generator = SpeculativeGenerator(model, make_drafter(speculative, model), speculative["config"],
                                             chat=args.chat)
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
