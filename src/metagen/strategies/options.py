"""A strategy's options, declared beside its config: name, kind, default, range and help, once.

    @dataclass(frozen=True)
    class RebaseConfig(TreeConfig):
        width: int = option(8, int, "total budget B (solutions wanted)", low=1, sizes_work=True)
        temperature: float = option(0.2, float, "T of the balancing softmax", above=0)

    declared = config_options(RebaseConfig)   # public name -> Option (kind, default, range, path)
    configured = configure(config, {"temperature": 0.5, "max_step_tokens": 32})

`option(...)` is a `dataclasses.field` whose metadata carries an `Option`; only fields so declared
are options (SamplingParams, callables, templates the runner builds are not). A field holding a
config of its own is included by `nested(StepConfig)`: its options join the outer config's under
the names they declare themselves (StepConfig's `delimiter` declares `name="step_delimiter"`).
Nothing is inferred from type hints, and no name is made up: the public name is the field's, or
the one its declaration gives.

`check_options(config)` checks every option a config declares directly (kind, then range or
choices; None only where declared optional) and is what each config's `__post_init__` calls; the
command line, the server's `metagen` field and `metagen eval` read the same declarations
(`StrategySpec.fields`, `check_value`), so every error names the option, its value and what it
allows. Checks between fields (MBR's n >= 2 without self-pairs, a template's fields) stay in the
config's `__post_init__`.

An int option that counts what the strategy does (samples, rounds, branches per node, beam widths,
iterations, depth in steps) is declared with `sizes_work=True`, and `check_work` bounds every such
option with one limit (a server's `--max-n`) before anything is built: the work of a search is a
product of such counts (beam width x expansions x steps model calls), so each must be bounded for
the product to be. Lengths in tokens or characters (max_step_tokens, block_tokens) are not
marked: params.max_tokens and the context bound them, or the option's own range does.
Cost: one walk over a config class's fields (cached); nothing here runs per token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

_OPTION = "metagen.option"  # the dataclass field metadata key of an `option`
_NESTED = "metagen.nested"  # ... and of a `nested` config
_ARTICLE = {int: "an int", float: "a float", bool: "a bool", str: "a str"}


@dataclass(frozen=True)
class Option:
    """One option: kind (bool, int, float or str), default, help; optional: None is allowed;
    low / above: inclusive / exclusive lower bound, high / below: upper bounds (None: unbounded);
    choices: the allowed strings; sizes_work: the int counts work (`check_work`); name: the public
    name (None: the field's); path: where it sits in its config (("step", "delimiter") when
    nested; set by `config_options`); opens: the value names a file or URL the strategy opens (a
    corpus, a training file), which a server refuses from a request."""

    kind: type
    default: object
    help: str
    optional: bool = False
    low: float | None = None
    above: float | None = None
    high: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None
    sizes_work: bool = False
    name: str | None = None
    path: tuple[str, ...] = ()
    opens: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _ARTICLE:
            raise ValueError(f"option kind {self.kind!r} is not one of bool, int, float, str")
        if self.sizes_work and self.kind is not int:
            raise ValueError(f"option {self.name or self.help!r}: sizes_work marks an int")

    def range_text(self) -> str:
        """What the range allows: ">= 1", "in (0, 1)", "in [1, 100000]", "one of beta, dirichlet";
        "" when unbounded."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        lower = (f"[{self.low}" if self.low is not None else f"({self.above}"
                 if self.above is not None else None)
        upper = (f"{self.high}]" if self.high is not None else f"{self.below})"
                 if self.below is not None else None)
        if lower and upper:
            return f"in {lower}, {upper}"
        if lower:
            return (">= " if lower[0] == "[" else "> ") + lower[1:]
        if upper:
            return ("<= " if upper[-1] == "]" else "< ") + upper[:-1]
        return ""

    def describe(self) -> str:
        """"name (kind, default d)", as an error listing the options a strategy accepts shows it."""
        kind = self.kind.__name__ + (" or null" if self.optional else "")
        return f"{self.name} ({kind}, default {self.default!r})"


def option(default, kind: type, help: str, *, optional: bool = False, low=None, above=None, high=None,
           below=None, choices=None, sizes_work: bool = False, name: str | None = None,
           opens: bool = False) -> dataclasses.Field:
    """A config field declared as an option (see the module): `dataclasses.field(default=default)`
    whose metadata carries its `Option`. The default must pass the option's own check."""
    declared = Option(kind, default, help, optional, low, above, high, below,
                      None if choices is None else tuple(choices), sizes_work, name, opens=opens)
    check_value(declared, default, name or "default")
    return dataclasses.field(default=default, metadata={_OPTION: declared})


def reuse(declared: Option) -> dataclasses.Field:
    """A field of another config declared by the same `Option` (the options every runner reads,
    `StrategyOptions`, appear in several configs): one declaration, its default and checks."""
    return dataclasses.field(default=declared.default, metadata={_OPTION: declared})


def nested(config: type) -> dataclasses.Field:
    """A field holding config dataclass `config` (default `config()`) whose options are the outer
    config's too, under the names they declare."""
    return dataclasses.field(default_factory=config, metadata={_NESTED: config})


@lru_cache(maxsize=None)
def config_options(config: type) -> dict[str, Option]:
    """The options config dataclass `config` declares, by public name, each with its path (those
    of `nested` configs included); ValueError when two share a name. O(fields)."""
    found: dict[str, Option] = {}

    def add(declared: Option) -> None:
        if declared.name in found:
            raise ValueError(f"{config.__name__} declares option {declared.name!r} twice")
        found[declared.name] = declared

    for field in dataclasses.fields(config):
        if _OPTION in field.metadata:
            declared = field.metadata[_OPTION]
            add(dataclasses.replace(declared, name=declared.name or field.name, path=(field.name,)))
        elif _NESTED in field.metadata:
            for inner in config_options(field.metadata[_NESTED]).values():
                add(dataclasses.replace(inner, path=(field.name, *inner.path)))
    return found


def check_value(declared: Option, value: object, where: str) -> None:
    """ValueError naming `where`, the value and what is allowed when `value` is not of the
    option's kind (an int is a float, a bool is not an int; None only when optional) or out of its
    range or choices."""
    kind = _ARTICLE[declared.kind]
    if value is None:
        if declared.optional:
            return
        raise ValueError(f"{where}=None is not allowed: it must be {kind}")
    if declared.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif declared.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, declared.kind)
    if not ok:
        raise ValueError(f"{where}={value!r} must be {kind}" + (" or null" if declared.optional else ""))
    if declared.choices is not None:
        if value not in declared.choices:
            raise ValueError(f"{where}={value!r} is not known; choose from {', '.join(declared.choices)}")
        return
    inside = ((declared.low is None or value >= declared.low) and (declared.above is None or value > declared.above)
              and (declared.high is None or value <= declared.high)
              and (declared.below is None or value < declared.below))
    if not inside:  # (NaN is inside no bound)
        raise ValueError(f"{where}={value!r} is out of range: must be {declared.range_text()}")


def check_options(config) -> None:
    """Check every option `config` declares directly (its nested configs check their own when
    built): ValueError naming the first bad one (`check_value`). Called by the configs'
    `__post_init__`. O(fields)."""
    for name, declared in config_options(type(config)).items():
        if len(declared.path) == 1:
            check_value(declared, getattr(config, declared.path[0]), name)


def check_work(fields: Mapping[str, Option], given: Mapping[str, object], limit: int, where: str = "",
               limit_name: str = "max_n") -> None:
    """ValueError naming the first option of `fields` that counts work (`Option.sizes_work`)
    and exceeds `limit`, its value and the limit. The value is the one in `given` (type-checked
    against `fields` first), else the option's default: a limit below a default refuses a request
    that omits the option, saying so. O(options)."""
    for name, declared in fields.items():
        value = given.get(name, declared.default)
        if declared.sizes_work and isinstance(value, int) and value > limit:
            default = "" if name in given else f"; {value} is its default: give {where}{name} <= {limit}"
            raise ValueError(f"{where}{name}={value} is out of range: must be <= {limit} ({limit_name}, the bound on "
                             f"every option that counts samples, rounds, branches or steps){default}")


def configure(config, overrides: Mapping[str, object]):
    """`config` with the options in `overrides` (public names, `config_options`) set; the
    configs' own checks run again (ValueError naming the option). Unknown names raise ValueError."""
    known = config_options(type(config))
    for name, value in overrides.items():
        if name not in known:
            raise ValueError(f"{name!r} is not an option of {type(config).__name__}; options: {', '.join(known)}")
        config = _set(config, known[name].path, value)
    return config


def _set(config, path: tuple[str, ...], value):
    head, *rest = path
    if not rest:
        return dataclasses.replace(config, **{head: value})
    inner = getattr(config, head)
    if inner is None:  # a nested config left unset: its declared class, at its defaults
        inner = next(field for field in dataclasses.fields(config) if field.name == head).metadata[_NESTED]()
    return dataclasses.replace(config, **{head: _set(inner, tuple(rest), value)})
