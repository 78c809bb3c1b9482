"""Strategies by name, for the command line, the server and the evaluation harness:

    spec = STRATEGIES["weighted_voting"]
    result = spec.run(generator, prompt, n, params, options, rng)
    n, options, overrides = spec.parse({"n": 8, "exp_scores": True})   # options by name, validated
    result = spec.run(generator, prompt, n, params, options, rng, overrides)

Each entry (a `StrategySpec`, spec.py) is registered at the end of the module that defines its
config (`spec.register`; its runner adapter in runners.py). This module finds those modules
itself, once, when it is first imported: every module of metagen.strategies (tree included) with
a line starting `register(` (`registering_module_names`: a text scan of the sources, about 2 ms,
nothing imported). It imports them in the order of `ORDER`, which is the order the CLI and errors
list the strategies in; a registering module that `ORDER` does not name comes after those it
names, by name. A module that registers a strategy without such a line is refused (ImportError)
once imported.

What an entry declares (its config dataclass and so its options, pooled, budget, needs) is
described in spec.py.
"""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path

from metagen.sampling import SamplingParams
from metagen.strategies.spec import (
    DEFAULT_N,
    StrategyOptions,
    StrategySpec,
    registered,
    registering_modules,
    value_is_head,
    value_reads_text_alone,
    value_scores_whole_answers,
)

__all__ = ["DEFAULT_N", "STRATEGIES", "StrategyOptions", "StrategySpec", "check_options", "default_params",
           "get_strategy", "value_is_head", "value_reads_text_alone", "value_scores_whole_answers"]

# the order the CLI and errors list strategies in, by module (see the module docstring)
ORDER = tuple(f"metagen.strategies.{name}" for name in (
    "runners", "best_of_n", "self_consistency", "adaptive_consistency", "weighted_voting", "borda_voting", "mbr",
    "self_refine", "verifier_refine", "in_context_navigation", "chain_programs", "dsp", "tree.step_beam_search",
    "tree.dvts",
    "tree.rebase", "tree.mcts", "tree.astar", "tree.particle_filter", "tree.blockwise_cd", "tokenwise_cd", "transfer_q", "tree.pg_td"))
_REGISTER_LINE = re.compile(r"^register\(", re.MULTILINE)


def registering_module_names(package: Path = Path(__file__).parent) -> list[str]:
    """The modules of metagen.strategies (tree included; `package`: its folder) holding a line
    that starts `register(` (`spec.register` called at module level), in the order of `ORDER`,
    those it does not name after, by name. Reads the sources; imports nothing."""
    found = set()
    for path in package.rglob("*.py"):
        if _REGISTER_LINE.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(package).with_suffix("").parts
            found.add(".".join(("metagen.strategies", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return [name for name in ORDER if name in found] + sorted(found - set(ORDER))


MODULES = tuple(registering_module_names())
for _module in MODULES:
    import_module(_module)
_unfound = registering_modules() - set(MODULES)
if _unfound:
    raise ImportError(f"{', '.join(sorted(_unfound))} register strategies without a line starting 'register(' "
                      "(registry.registering_module_names finds the registering modules by that line)")

STRATEGIES: dict[str, StrategySpec] = {spec.name: spec for module in MODULES for spec in registered(module)}


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
