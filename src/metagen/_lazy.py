"""Packages whose names are imported on first use, so that importing a light name (a config, a
dataclass) does not import torch through its package's `__init__`.

    lazy_package(__name__, {"SamplingParams": "params", "top_p": "top_p", ...})

Each exported name maps to the submodule that defines it; `package.name` imports that submodule
on first use and keeps the value (later reads are plain attribute reads). An exported name that
is also a submodule's name (`top_p`, the function of `top_p.py`) stays the exported value, as it
would after an eager `from .top_p import top_p`: the import system's binding of the submodule on
its package is declined for that name.
"""

from __future__ import annotations

import importlib
import sys
import types


class LazyPackage(types.ModuleType):
    """A package module with `_EXPORTS` (name -> submodule), see the module docstring."""

    def __getattr__(self, name: str):
        submodule = self.__dict__["_EXPORTS"].get(name)
        if submodule is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{self.__name__}.{submodule}"), name)
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value) -> None:
        if (isinstance(value, types.ModuleType) and name in self.__dict__.get("_EXPORTS", ())
                and value.__name__ == f"{self.__name__}.{name}"):
            return  # the submodule `name` was imported: `package.name` stays the exported value
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(self.__dict__) | set(self.__dict__["_EXPORTS"]))


def lazy_package(name: str, exports: dict[str, str]) -> None:
    """Make package `name` (call it from its `__init__` with `__name__`) a `LazyPackage`."""
    module = sys.modules[name]
    module._EXPORTS = dict(exports)
    module.__class__ = LazyPackage
