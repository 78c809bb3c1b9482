"""A strategy's options come from its config dataclass: names, kinds, defaults, validation by name."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from metagen.sampling import SamplingParams
from metagen.strategies.options import check_value, config_fields, configure
from metagen.strategies.registry import STRATEGIES, StrategyOptions, get_strategy


@dataclass(frozen=True)
class Inner:
    delimiter: str | None = "\n"
    inner_limit: int = 3

    def __post_init__(self) -> None:
        if self.inner_limit < 1:
            raise ValueError(f"inner_limit={self.inner_limit} is out of range: must be >= 1")


@dataclass(frozen=True)
class Toy:
    width: int = 4
    rate: float = 0.5
    flag: bool = False
    params: SamplingParams = SamplingParams()
    inner: Inner = field(default_factory=Inner)


def test_scalar_fields_and_nested_ones_are_options_sampling_params_are_not():
    fields = config_fields(Toy)
    assert list(fields) == ["width", "rate", "flag", "inner_delimiter", "inner_limit"]
    assert (fields["width"].kind, fields["width"].default, fields["width"].optional) == (int, 4, False)
    assert (fields["inner_delimiter"].kind, fields["inner_delimiter"].optional) == (str, True)
    assert fields["inner_limit"].path == ("inner", "inner_limit")


def test_configure_sets_nested_fields_and_reruns_the_config_checks():
    toy = configure(Toy(), {"width": 9, "inner_limit": 7})
    assert (toy.width, toy.inner.inner_limit, toy.inner.delimiter) == (9, 7, "\n")
    with pytest.raises(ValueError, match="inner_limit=0 is out of range"):
        configure(Toy(), {"inner_limit": 0})


@pytest.mark.parametrize(("name", "value", "ok"), [
    ("width", 3, True), ("width", 3.0, False), ("width", True, False), ("rate", 1, True), ("rate", "1", False),
    ("flag", 0, False), ("inner_delimiter", None, True), ("width", None, False)])
def test_check_value_is_strict_about_kinds(name, value, ok):
    option = config_fields(Toy)[name]
    if ok:
        check_value(option, value, name)
    else:
        with pytest.raises(ValueError, match=f"^{name}="):
            check_value(option, value, name)


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
    from metagen.strategies.options import config_fields

    shared = config_fields(StrategyOptions)
    checked = differing = 0
    for spec in STRATEGIES.values():
        config = spec.config_class()
        if config is None:
            continue
        for name, field in config_fields(config).items():
            if name in shared and field.path[0] not in spec.set_by_run:
                assert field.kind == shared[name].kind, (spec.name, name)
                assert field.optional or not shared[name].optional, (spec.name, name)  # never looser than the config
                assert spec.fields()[name].default == shared[name].default, (spec.name, name)
                checked += 1
                differing += field.default != shared[name].default
    assert checked >= 20 and differing >= 10  # pattern, math, answer_field, aggregation, step_delimiter
