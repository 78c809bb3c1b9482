"""A strategy's options are declared beside its config: names, kinds, defaults, ranges, help."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass

import pytest

from metagen.sampling import SamplingParams
from metagen.strategies.options import Option, check_options, check_value, config_options, configure, nested, option
from metagen.strategies.registry import STRATEGIES, StrategyOptions, get_strategy


@dataclass(frozen=True)
class Inner:
    delimiter: str | None = option("\n", str, "ends a step", optional=True, name="inner_delimiter")
    inner_limit: int = option(3, int, "a limit", low=1)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class Toy:
    width: int = option(4, int, "a width", low=1, high=64, sizes_work=True)
    rate: float = option(0.5, float, "a rate", above=0, below=1)
    flag: bool = option(False, bool, "a flag")
    mode: str = option("a", str, "a mode", choices=("a", "b"))
    undeclared: int = 7  # not an option: only declared fields are
    params: SamplingParams = SamplingParams()
    inner: Inner = nested(Inner)

    def __post_init__(self) -> None:
        check_options(self)


def test_declared_fields_and_nested_ones_are_options_nothing_else():
    fields = config_options(Toy)
    assert list(fields) == ["width", "rate", "flag", "mode", "inner_delimiter", "inner_limit"]
    assert (fields["width"].kind, fields["width"].default, fields["width"].optional) == (int, 4, False)
    assert fields["width"].sizes_work and not fields["inner_limit"].sizes_work
    assert (fields["inner_delimiter"].kind, fields["inner_delimiter"].optional) == (str, True)
    assert fields["inner_delimiter"].path == ("inner", "delimiter")  # its public name is the one it declares
    assert fields["inner_limit"].path == ("inner", "inner_limit")


def test_configure_sets_nested_fields_and_reruns_the_config_checks():
    toy = configure(Toy(), {"width": 9, "inner_limit": 7})
    assert (toy.width, toy.inner.inner_limit, toy.inner.delimiter) == (9, 7, "\n")
    with pytest.raises(ValueError, match="^inner_limit=0 is out of range: must be >= 1$"):
        configure(Toy(), {"inner_limit": 0})
    with pytest.raises(ValueError, match="'undeclared' is not an option of Toy"):
        configure(Toy(), {"undeclared": 1})


@pytest.mark.parametrize(("fields", "message"), [
    ({"width": 65}, r"^width=65 is out of range: must be in \[1, 64\]$"),
    ({"rate": 1.0}, r"^rate=1.0 is out of range: must be in \(0, 1\)$"),
    ({"rate": float("nan")}, r"^rate=nan is out of range"),
    ({"mode": "c"}, r"^mode='c' is not known; choose from a, b$"),
    ({"flag": 1}, r"^flag=1 must be a bool$"),
    ({"width": None}, r"^width=None is not allowed: it must be an int$"),
])
def test_the_config_checks_its_declared_ranges_naming_the_option(fields, message):
    with pytest.raises(ValueError, match=message):
        Toy(**fields)


def test_range_text_and_a_default_outside_its_own_range():
    assert [Option(int, 1, "", low=1).range_text(), Option(float, 1.0, "", above=0).range_text(),
            Option(int, 1, "", high=4).range_text(), Option(float, 0.5, "", low=0, below=1).range_text(),
            Option(str, "x", "", choices=("x",)).range_text(), Option(int, 0, "").range_text()] == [
        ">= 1", "> 0", "<= 4", "in [0, 1)", "one of x", ""]
    with pytest.raises(ValueError, match="default=0 is out of range: must be >= 1"):
        option(0, int, "a count", low=1)


@pytest.mark.parametrize(("name", "value", "ok"), [
    ("width", 3, True), ("width", 3.0, False), ("width", True, False), ("rate", 1, False), ("rate", "1", False),
    ("rate", 0.25, True), ("flag", 0, False), ("inner_delimiter", None, True), ("width", None, False)])
def test_check_value_is_strict_about_kinds(name, value, ok):
    declared = config_options(Toy)[name]
    if ok:
        check_value(declared, value, name)
    else:
        with pytest.raises(ValueError, match=f"^{name}="):
            check_value(declared, value, name)


def _scalar(hint) -> tuple[type | None, bool]:
    """(kind, optional) of a scalar or `scalar | None` annotation, else (None, False)."""
    if hint in (bool, int, float, str):
        return hint, False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [arg for arg in args if arg is not type(None)]
        if len(args) == 2 and len(rest) == 1 and rest[0] in (bool, int, float, str):
            return rest[0], True
    return None, False


def _scalar_fields(config: type, path=()):
    """(path, kind, optional) of every scalar init field of `config`, into `nested` configs."""
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        if not field.init:
            continue
        kind, optional = _scalar(hints[field.name])
        if kind is not None:
            yield (*path, field.name), kind, optional
        elif "metagen.nested" in field.metadata:
            yield from _scalar_fields(field.metadata["metagen.nested"], (*path, field.name))


def test_every_scalar_field_of_a_registered_config_is_declared_or_set_by_the_runner():
    """An option cannot go missing: each scalar init field of every registered strategy's config
    is declared (with the kind its annotation says) or set by the runner (`set_by_run`)."""
    checked = 0
    for spec in STRATEGIES.values():
        config = spec.config_class()
        if config is None:
            continue
        declared = {option.path: option for option in config_options(config).values()}
        for path, kind, optional in _scalar_fields(config):
            if path in declared:
                assert (declared[path].kind, declared[path].optional) == (kind, optional), (spec.name, path)
                checked += 1
            else:
                assert path[0] in spec.set_by_run, f"{spec.name}: {'.'.join(path)} is neither declared nor set by run"
    assert checked > 50


def test_a_declared_default_is_the_dataclass_default():
    for config in {spec.config_class() for spec in STRATEGIES.values()} - {None} | {StrategyOptions}:
        built = config()
        for name, declared in config_options(config).items():
            value = built
            for part in declared.path:
                value = getattr(value, part)
            assert value == declared.default, (config.__name__, name)
            assert declared.help, (config.__name__, name)  # every option says what it is


def test_every_strategy_has_n_and_its_config_fields():
    rebase = get_strategy("rebase").fields()
    assert {"n", "temperature", "max_steps", "max_step_tokens", "step_delimiter", "value", "aggregation"} <= set(rebase)
    assert "width" not in rebase and "params" not in rebase  # set by the runner from n and the request
    assert set(get_strategy("self_consistency").fields()) == {"n", "pattern", "math", "answer_field"}
    assert get_strategy("mcts").fields()["expansions"].default == 4  # the registry's default, not the config's 3
    for spec in STRATEGIES.values():
        assert "n" in spec.fields()


def test_parse_splits_shared_options_from_config_overrides():
    n, options, overrides = get_strategy("rebase").parse({"n": 6, "value": "steps", "temperature": 0.5, "math": False})
    assert n == 6
    assert options == StrategyOptions(value="steps", math=False)
    assert overrides == {"temperature": 0.5}


@pytest.mark.parametrize(("name", "given", "message"), [
    ("self_consistency", {"width": 2}, "x.width is not an option of strategy 'self_consistency'"),
    ("self_consistency", {"math": "yes"}, "x.math='yes' must be a bool"),
    ("rebase", {"temperature": 0.0}, "x.temperature=0.0 is out of range: must be > 0"),
    ("rebase", {"aggregation": "mean"}, "x.aggregation='mean' is not known"),
    ("greedy", {"n": 2}, "x.n=2 is out of range for strategy 'greedy'"),
    ("self_consistency", {"pattern": "("}, "x.pattern='\\(' is not a valid regular expression"),
])
def test_parse_refuses_by_field_name(name, given, message):
    with pytest.raises(ValueError, match="^" + message):
        get_strategy(name).parse(given, "x.")


def test_unknown_field_message_lists_what_the_strategy_accepts():
    with pytest.raises(ValueError, match=r"it accepts: n \(int, default 8\), pattern"):
        get_strategy("self_consistency").parse({"beam": 1})


def test_run_builds_the_config_from_n_the_registry_defaults_and_the_overrides(monkeypatch):
    from metagen.decoding import capabilities as caps
    from metagen.strategies.tree import runner

    seen = {}

    def capture(search, config, generator, prompt, options, rng, **_):
        seen["search"], seen["config"] = search.__name__, config
        return "result"

    class Server:
        capabilities = frozenset({caps.STEP_CONTINUATION})

    monkeypatch.setattr(runner, "run_search", capture)
    spec = get_strategy("mcts")
    n, options, overrides = spec.parse({"n": 5, "value": "steps", "exploration": 2.0, "max_step_tokens": 9})
    params = SamplingParams(temperature=0.7, max_tokens=20)
    assert spec.run(Server(), "q", n, params, options, None, overrides) == "result"
    config = seen["config"]
    assert seen["search"] == "mcts"
    assert (config.iterations, config.expansions, config.exploration) == (5, 4, 2.0)  # n, registry default, given
    assert (config.step.delimiter, config.step.max_step_tokens) == ("\n", 9)
    assert config.params.temperature == 0.7 and config.params.n == 1


def test_the_shared_options_keep_their_kind_and_report_the_default_that_runs():
    """StrategyOptions is the one hand-written set (the harness passes one to every strategy). Each
    of its fields that a config also declares has that config's kind (never allowing None where the
    config does not; step_delimiter may not be None, which StepConfig allows); its default is the registry's
    own and may differ from the config's (math=True where SelfConsistencyConfig says False, step
    delimiter "\\n" where StepConfig says "\\n\\n"): the runner passes StrategyOptions' value, so
    that is the default an option reports."""
    shared = config_options(StrategyOptions)
    checked = differing = 0
    for spec in STRATEGIES.values():
        config = spec.config_class()
        if config is None:
            continue
        for name, field in config_options(config).items():
            if name in shared and field.path[0] not in spec.set_by_run:
                assert field.kind == shared[name].kind, (spec.name, name)
                assert field.optional or not shared[name].optional, (spec.name, name)  # never looser than the config
                assert spec.fields()[name].default == shared[name].default, (spec.name, name)
                checked += 1
                differing += field.default != shared[name].default
    assert checked >= 20 and differing == 0  # pattern, math, answer_field, aggregation, step_delimiter: one default each


# Every int option of the registry is a count that multiplies the work (samples, rounds, branches,
# steps: bounded by `max_n`) or a length in tokens or characters bounded by something else
# (max_tokens, or the config's own range). A new int option must be put in one of the two sets.
SIZES_WORK = {
    "greedy": {"n"}, "best_of_n": {"n"}, "best_of_n_logprob": {"n"}, "self_consistency": {"n"},
    "weighted_voting": {"n"}, "borda": {"n"}, "mbr_chrf": {"n"}, "mbr_bleu": {"n"}, "mbr_edit": {"n"},
    "mbr_embedding": {"n"}, "self_refine": {"n"}, "chain_of_thought": {"n", "max_tool_calls"},
    "self_ask": {"n", "max_tool_calls"}, "calculator": {"n", "max_tool_calls"},
    "search": {"n", "max_tool_calls"}, "s2a": {"n", "max_tool_calls"}, "self_ask_search": {"n", "max_tool_calls"},
    "dsp": {"n", "hops", "demos", "samples", "train_limit"},
    "best_of_n_value": {"n"},
    "step_beam": {"n", "max_steps"}, "dvts": {"n", "max_steps"}, "rebase": {"n", "max_steps"},
    "mcts": {"n", "expansions", "max_steps"}, "astar": {"n", "expansions", "solutions"},
    "particle_filter": {"n", "max_steps"}, "blockwise_cd": {"n", "max_blocks"}, "tokenwise_cd": {"n"},
    "transfer_q": {"n", "rollouts"},
    "adaptive_consistency": {"n", "round_size"}, "code_cluster": {"n"}, "adaptive_code_cluster": {"n", "round_size"},
    "mbr_judge": {"n"}, "verifier_refine": {"n", "initial_candidates", "revisions_per_round", "beam"},
    "in_context_navigation": {"n"}, "pg_td": {"n", "top_k"},
}
LENGTHS = {"max_step_tokens", "block_tokens", "max_tool_chars", "answer_tokens", "max_rollout_tokens", "rollout_tokens"}
# ints that count no model work: the stopping rule's Monte Carlo draws (bounded by its config's
# range) and its seed, the passages a search returns (its text clipped to max_tool_chars)
NOT_MODEL_WORK = {"mc_samples", "mc_seed", "passages"}


def test_every_int_option_is_marked_as_sizing_the_work_or_is_a_length():
    assert set(SIZES_WORK) == set(STRATEGIES)
    for spec in STRATEGIES.values():
        fields = spec.fields()
        assert {name for name, field in fields.items() if field.sizes_work} == SIZES_WORK[spec.name], spec.name
        others = {name for name, field in fields.items() if field.kind is int and not field.sizes_work}
        assert others <= LENGTHS | NOT_MODEL_WORK, (spec.name, others - LENGTHS - NOT_MODEL_WORK)


def test_the_marks_of_configs_outside_the_registry_and_of_nested_fields():
    from metagen.strategies.tree.mcts import MCTSConfig
    from metagen.strategies.verifier_refine import VerifierRefineConfig

    refine = config_options(VerifierRefineConfig)
    assert {name for name, field in refine.items() if field.sizes_work} == {
        "initial_candidates", "rounds", "revisions_per_round", "beam"}
    mcts = config_options(MCTSConfig)
    assert mcts["iterations"].sizes_work and not mcts["max_step_tokens"].sizes_work  # nested: step.max_step_tokens


@pytest.mark.parametrize(("name", "option"), [(name, option) for name, options in SIZES_WORK.items()
                                              for option in sorted(options)])
def test_parse_bounds_every_option_that_sizes_the_work(name, option):
    """n = 10**9 (62.5 M request groups in a server before any check) and every other count
    are refused by `parse` when `max_n` is given, naming the field, the value and the limit."""
    spec = get_strategy(name)
    value = {"value": "steps"} if spec.uses_value else {}
    if "retriever" in spec.required_options:  # a file that exists: parse checks the path, reads nothing
        value["retriever"] = f"bm25:{__file__}"
    with pytest.raises(ValueError, match=rf"^x\.{option}=1000000000 is out of range: must be <= 128 \(--max-n"):
        spec.parse({option: 10**9, **value}, "x.", max_n=128, limit_name="--max-n")
    if option != "n" or spec.budget != "none":
        spec.parse({option: 64, **value}, "x.", max_n=64)  # at the limit: accepted


def test_the_bound_applies_to_defaults_too_and_not_to_lengths():
    spec = get_strategy("self_consistency")
    with pytest.raises(ValueError, match=r"^n=8 is out of range: must be <= 4 \(max_n.*8 is its default: give n <= 4"):
        spec.parse({}, max_n=4)
    assert spec.parse({"n": 4}, max_n=4)[0] == 4
    with pytest.raises(ValueError, match=r"^x\.max_steps=16 is out of range: must be <= 8 .*give x\.max_steps <= 8"):
        get_strategy("rebase").parse({"n": 2, "value": "steps"}, "x.", max_n=8)
    get_strategy("rebase").parse({"n": 2, "value": "steps", "max_steps": 8, "max_step_tokens": 10**6}, max_n=8)
    assert spec.parse({"n": 10**6})[0] == 10**6  # the library sets no bound unless asked
