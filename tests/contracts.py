"""Checks that a class claiming a declared contract (a `typing.Protocol`) implements all of it.

`violations(cls, protocol, instance)` lists what `cls` lacks: a method or property the protocol
declares that `cls` does not define itself (a class subclassing a protocol would otherwise inherit
its empty body, which returns None), a method whose parameters differ from the protocol's (names,
kinds, defaults; extra parameters are allowed after them when they have defaults), a coroutine
where the protocol has a plain function or the other way round, and a data member `instance`
lacks.
"""

from __future__ import annotations

import inspect
from typing import Protocol

DATA = object()  # a data member: declared by annotation only


def members(protocol: type) -> dict[str, object]:
    """name -> the protocol's declaration (a function, a property, or DATA), bases first."""
    found: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass is Protocol or not klass.__dict__.get("_is_protocol", False):
            continue
        for name in klass.__dict__.get("__annotations__", {}):
            found[name] = DATA
        for name, value in vars(klass).items():
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                found[name] = value
    return found


def _owner(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def _parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def _signature_problem(name: str, declared, implemented) -> str | None:
    want, have = _parameters(declared), _parameters(implemented)
    shape = [(p.name, p.kind, p.default) for p in want]
    if [(p.name, p.kind, p.default) for p in have[:len(want)]] != shape or any(
            p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            for p in have[len(want):]):
        return f"{name}{inspect.signature(implemented)} differs from the protocol's {name}{inspect.signature(declared)}"
    if inspect.iscoroutinefunction(declared) != inspect.iscoroutinefunction(implemented):
        return f"{name}: the protocol's is {'' if inspect.iscoroutinefunction(declared) else 'not '}async"
    return None


def violations(cls: type, protocol: type, instance: object | None = None) -> list[str]:
    """What `cls` (and `instance`, for data members) lacks of `protocol`; empty when it implements it."""
    problems = []
    for name, declared in members(protocol).items():
        if declared is DATA:
            if instance is None:
                problems.append(f"{name}: a data member, checked only on an instance (none given)")
            elif not hasattr(instance, name):
                problems.append(f"{name}: missing on the instance")
            continue
        owner = _owner(cls, name)
        if owner is None or owner.__dict__.get("_is_protocol", False) or vars(owner)[name] is declared:
            problems.append(f"{name}: not defined by {cls.__name__} (only declared by {protocol.__name__})")
            continue
        implemented = vars(owner)[name]
        if isinstance(declared, property):
            if not isinstance(implemented, property):
                problems.append(f"{name}: the protocol's is a property, {cls.__name__}'s is not")
        elif not inspect.isfunction(implemented):
            problems.append(f"{name}: the protocol's is a method, {cls.__name__}'s is {type(implemented).__name__}")
        else:
            problem = _signature_problem(name, declared, implemented)
            if problem:
                problems.append(problem)
    return problems
