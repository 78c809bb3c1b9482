"""`metagen generate PROMPT --strategy NAME`: one meta-generation strategy on one prompt.

`--n` is the strategy's budget (samples or rounds, see `metagen eval --help`); the candidates are
drawn by a `LocalGenerator`, a `SpeculativeGenerator` with --speculative, or the remote generator of
--backend (the strategy's capability check refuses what a server cannot do). Prints the chosen text
(and its answer), or with --json the chosen candidate, every candidate, the votes and the cost.
"""

from __future__ import annotations

import argparse
import json

from metagen.cli import backend, common
from metagen.cli.sampling import SAMPLING_ONLY, given


def generate_with_strategy(args: argparse.Namespace, params, speculative: dict | None) -> int:
    from dataclasses import replace

    from metagen.cli.generate import chat_prompt
    from metagen.cli.speculative import make_drafter
    from metagen.decoding import LocalGenerator
    from metagen.strategies.registry import StrategyOptions, check_options, get_strategy

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
    options = StrategyOptions(value=args.value, step_delimiter=args.step_delimiter, aggregation=args.aggregation,
                              answer_field=args.answer_field)
    check_options([spec.name], options)
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
        result = spec.run(generator, prompt, budget, replace(params, n=1), options, rng)
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
            for c in result.candidates
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
    print(f"metagen: warning: all {len(result.candidates)} candidates ended before the constraint accepted them: "
          "the chosen output is not valid (raise --max-tokens)", file=sys.stderr)
    return 3
