"""Run code as on an install of metagen's core plus some extras, in this fully equipped
environment: the top-level modules of every distribution that only the *other* extras bring in
are made unimportable (`sys.modules[name] = None`, so `import name` raises ImportError as if it
were not installed).

What an extra brings in is read from the installed metadata: the requirements of metagen's core
and of the named extras, closed over their own requirements (markers evaluated, the extras they
ask of their dependencies included), against the same closure of every extra. A distribution in
the second set and not the first is blocked, by the import names `packages_distributions` gives.

    blocked = blocked_modules({"serve", "client"})
    with blocking(blocked): ...                       # in this process
    subprocess.run(..., env=environment(blocked))     # in a child Python (sitecustomize)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from metagen.extras import DISTRIBUTION

SITE = Path(__file__).resolve().parent / "install_site"  # its sitecustomize.py reads BLOCK_ENV
BLOCK_ENV = "METAGEN_TEST_BLOCKED_MODULES"


def _requirements(distribution: str, extras: Iterable[str]) -> list[Requirement]:
    try:
        declared = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    wanted = [""] + list(extras)
    found = []
    for line in declared:
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in wanted):
            found.append(requirement)
    return found


def _closure(extras: Iterable[str], root: str = DISTRIBUTION) -> set[str]:
    """Canonical names of the installed distributions `root` (metagen) with `extras` pulls in."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [(root, tuple(extras))]
    while todo:
        distribution, asked = todo.pop()
        for requirement in _requirements(distribution, asked):
            name = canonicalize_name(requirement.name)
            key = (name, tuple(sorted(requirement.extras)))
            if key in seen or name == canonicalize_name(DISTRIBUTION):
                continue
            seen.add(key)
            todo.append((requirement.name, tuple(requirement.extras)))
    return {name for name, _ in seen}


@lru_cache(maxsize=None)
def _modules_by_distribution() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for module, distributions in metadata.packages_distributions().items():
        for distribution in distributions:
            found.setdefault(canonicalize_name(distribution), set()).add(module)
    return found


def all_extras() -> list[str]:
    return list(metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or [])


def blocked_modules(extras: Iterable[str] = ()) -> list[str]:
    """Import names of what only the extras not in `extras` install (dev and docs count as extras)."""
    extras = set(extras)
    unknown = extras - set(all_extras())
    if unknown:
        raise ValueError(f"unknown extras {sorted(unknown)}; metagen has {all_extras()}")
    kept = _closure(extras)
    others = _closure(all_extras()) - kept
    modules = _modules_by_distribution()
    kept_modules = set().union(*(modules.get(name, set()) for name in kept))
    return sorted(set().union(*(modules.get(name, set()) for name in others)) - kept_modules - {"metagen", "tests"})


@lru_cache(maxsize=None)
def _test_runner_modules() -> frozenset[str]:
    """What the running test process itself needs (pytest, xdist): never blocked in-process."""
    names = {"pytest", "pytest-xdist"}
    for root in list(names):
        names |= _closure((), root)
    modules = _modules_by_distribution()
    return frozenset(set().union(*(modules.get(canonicalize_name(name), set()) for name in names)))


@contextlib.contextmanager
def blocking(modules: Iterable[str]):
    """`import m` raises ImportError for each of `modules` (and their submodules) inside the block,
    in this process (the test runner's own modules excepted)."""
    modules = set(modules) - _test_runner_modules()
    saved = {name: sys.modules[name] for name in list(sys.modules) if name.split(".")[0] in modules}
    for name in saved:
        del sys.modules[name]
    for name in modules:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in modules:
            sys.modules.pop(name, None)
        for name in [name for name in sys.modules if name.split(".")[0] in modules]:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def environment(modules: Iterable[str], base: dict | None = None) -> dict[str, str]:
    """The environment of a child Python that blocks `modules` at startup (sitecustomize)."""
    environment = dict(os.environ if base is None else base)
    environment[BLOCK_ENV] = ",".join(modules)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), environment.get("PYTHONPATH", "")]))
    return environment
