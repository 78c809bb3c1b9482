"""A strategy's configuration fields, read from its own config dataclass, and their validation.

    fields = config_fields(RebaseConfig)     # name -> OptionField (kind, optional, default, path)
    configured = configure(config, {"temperature": 0.5, "max_step_tokens": 32})

The configurable fields of a config dataclass are its scalar fields (int, float, bool, str, each
possibly `| None`); a nested config dataclass (a tree search's `step: StepConfig`) contributes
its own scalar fields, named `<outer>_<inner>` unless the inner name already says it
(`step.delimiter` -> `step_delimiter`, `step.max_step_tokens` -> `max_step_tokens`). Fields of
other types (SamplingParams, callables) are never options: the runner sets them.

`check_value` checks a value's type against its field (an int is a float, a bool is not an int);
ranges are the config's own `__post_init__` checks, which name the field.

An int field that counts what the strategy does (samples, rounds, branches per node, beam widths,
iterations, depth in steps) is declared with `sizes_work(default)`; its option is marked
(`OptionField.sizes_work`), and `check_work` bounds every marked option with one limit (a server's
`--max-n`) before anything is built: the work of a search is a product of such counts (beam width x
expansions x steps model calls), so each must be bounded for the product to be. Lengths in tokens
or characters (max_step_tokens, block_tokens) are not marked: params.max_tokens and the context
bound them, or the config's own range does.
Cost: one `typing.get_type_hints` per config class (cached); nothing here runs per token.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

SCALARS = (bool, int, float, str)
_SIZES_WORK = "sizes_work"  # the dataclass field metadata key of `sizes_work`


def sizes_work(default: int):
    """An int config field that counts work (samples, rounds, branches, steps): `field(default=...)`
    marked so that `check_work` bounds its option (see the module)."""
    return dataclasses.field(default=default, metadata={_SIZES_WORK: True})


@dataclass(frozen=True)
class OptionField:
    """One configurable field: kind (bool, int, float or str), optional (None allowed), its
    default, its path in the config (("step", "delimiter") for a nested field), and whether it
    counts work (declared with `sizes_work`; bounded by `check_work`)."""

    name: str
    kind: type
    optional: bool
    default: object
    path: tuple[str, ...]
    sizes_work: bool = False

    def describe(self) -> str:
        kind = self.kind.__name__ + (" or null" if self.optional else "")
        return f"{self.name} ({kind}, default {self.default!r})"


def _scalar(hint) -> tuple[type | None, bool]:
    """(kind, optional) of a type hint that is a scalar or `scalar | None`; (None, False) else."""
    if hint in SCALARS:
        return hint, False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1 and args[0] in SCALARS and len(typing.get_args(hint)) == 2:
            return args[0], True
    return None, False


def _nested(hint) -> type | None:
    """The config dataclass of a hint that is one (or one `| None`), else None; SamplingParams
    is never one (the request's sampling is the runner's to set)."""
    from metagen.sampling import SamplingParams

    candidates = [hint, *typing.get_args(hint)]
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate) and candidate is not SamplingParams:
            return candidate
    return None


def _default(field: dataclasses.Field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


@lru_cache(maxsize=None)
def config_fields(config: type) -> dict[str, OptionField]:
    """The configurable fields of config dataclass `config`, by option name (see the module)."""
    hints = typing.get_type_hints(config)
    found: dict[str, OptionField] = {}
    for field in dataclasses.fields(config):
        if not field.init:
            continue
        kind, optional = _scalar(hints[field.name])
        if kind is not None:
            found[field.name] = OptionField(field.name, kind, optional, _default(field), (field.name,),
                                            bool(field.metadata.get(_SIZES_WORK)))
            continue
        nested = _nested(hints[field.name])
        if nested is None:
            continue
        outer_default = _default(field)
        for inner in config_fields(nested).values():
            name = inner.name if field.name in inner.name else f"{field.name}_{inner.name}"
            default = getattr(outer_default, inner.path[0], inner.default) if outer_default is not None else inner.default
            found[name] = OptionField(name, inner.kind, inner.optional, default, (field.name, *inner.path),
                                      inner.sizes_work)
    return found


def check_value(field: OptionField, value: object, where: str) -> None:
    """TypeError-free check: ValueError naming `where` when `value` is not of the field's kind."""
    if value is None:
        if field.optional:
            return
        raise ValueError(f"{where}=None is not allowed: it must be a {field.kind.__name__}")
    if field.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif field.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, field.kind)
    if not ok:
        raise ValueError(f"{where}={value!r} must be a {field.kind.__name__}"
                         + (" or null" if field.optional else ""))


def check_work(fields: Mapping[str, OptionField], given: Mapping[str, object], limit: int, where: str = "",
               limit_name: str = "max_n") -> None:
    """ValueError naming the first option of `fields` that counts work (`OptionField.sizes_work`)
    and exceeds `limit`, its value and the limit. The value is the one in `given` (type-checked
    against `fields` first), else the option's default: a limit below a default refuses a request
    that omits the option, saying so. O(options)."""
    for name, field in fields.items():
        value = given.get(name, field.default)
        if field.sizes_work and isinstance(value, int) and value > limit:
            default = "" if name in given else f"; {value} is its default: give {where}{name} <= {limit}"
            raise ValueError(f"{where}{name}={value} is out of range: must be <= {limit} ({limit_name}, the bound on "
                             f"every option that counts samples, rounds, branches or steps){default}")


def configure(config, overrides: Mapping[str, object]):
    """`config` with the options in `overrides` (names from `config_fields`) set; the config's
    own checks run again (ValueError naming the field). Unknown names raise ValueError."""
    known = config_fields(type(config))
    for name, value in overrides.items():
        if name not in known:
            raise ValueError(f"{name!r} is not a field of {type(config).__name__}; fields: {', '.join(known)}")
        config = _set(config, known[name].path, value)
    return config


def _set(config, path: tuple[str, ...], value):
    head, *rest = path
    if not rest:
        return dataclasses.replace(config, **{head: value})
    inner = getattr(config, head)
    if inner is None:
        inner = _nested(typing.get_type_hints(type(config))[head])()
    return dataclasses.replace(config, **{head: _set(inner, tuple(rest), value)})
