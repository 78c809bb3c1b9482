"""The strategy option flags of `metagen generate` are made from the declarations: one flag per
option, named deterministically (`flag_of`), colliding with no other flag, with the declared help."""

from __future__ import annotations

import argparse

from metagen.cli import build_parser
from metagen.cli.strategy import SAMPLING_FLAGS, flag_of, option_help, strategy_options


def _generate() -> argparse.ArgumentParser:
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices["generate"]


def test_every_strategy_option_has_one_flag_that_no_other_option_takes():
    parser = _generate()
    strategy_dests = {"strategy_" + name for name in strategy_options()}
    others = {flag for action in parser._actions if action.dest not in strategy_dests for flag in action.option_strings}
    flags = {}
    for name in strategy_options():
        flag = flag_of(name)
        assert flag not in others, f"{name}: {flag} is another option's flag; add its name to SAMPLING_FLAGS' rule"
        flags[flag] = name
        action = next(action for action in parser._actions if action.dest == "strategy_" + name)
        assert flag in action.option_strings
    assert len(flags) == len(strategy_options())


def test_a_sampling_flags_name_gets_the_strategy_prefix_and_no_other_does():
    assert "temperature" in SAMPLING_FLAGS and flag_of("temperature") == "--strategy-temperature"
    assert flag_of("max_steps") == "--max-steps" and flag_of("max_step_tokens") == "--max-step-tokens"
    prefixed = {name for name in strategy_options() if flag_of(name).startswith("--strategy-")}
    assert prefixed == {name for name in strategy_options() if name.replace("_", "-") in SAMPLING_FLAGS}


def test_the_help_is_the_declarations():
    options = strategy_options()
    temperature = option_help(options["temperature"])
    assert temperature == ("T of the softmax sharing the budget by value (rebase); T of the resampling weights "
                           "exp(V / T) (particle_filter); float > 0; default 0.2 (rebase), 0.1 (particle_filter)")
    assert option_help(options["mc_samples"]).endswith("; int in [1, 100000]; default 4096")
    rule = next(action for action in _generate()._actions if action.dest == "strategy_rule")
    assert rule.choices == ("beta", "dirichlet")


def test_the_shared_options_flags_of_generate_and_eval_are_their_declarations():
    import pytest

    from metagen.strategies.spec import SHARED, StrategyOptions

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    for command in ("generate", "eval"):
        actions = {action.dest: action for action in commands.choices[command]._actions}
        for name in ("value", "step_delimiter", "aggregation", "answer_field"):
            assert actions[name].default == SHARED[name].default, (command, name)
            assert actions[name].help.startswith(SHARED[name].help), (command, name)
        assert actions["aggregation"].choices == SHARED["aggregation"].choices == ("best", "majority", "weighted")
    with pytest.raises(ValueError, match=r"^aggregation='mean' is not known; choose from best, majority, weighted$"):
        StrategyOptions(aggregation="mean")  # what metagen eval builds from its flags
