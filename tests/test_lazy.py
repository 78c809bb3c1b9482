"""Packages that export names lazily do it through one mechanism, `metagen._lazy`, and every name
of each table resolves to the object the submodule it names defines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from metagen._lazy import LazyPackage

SOURCE = Path(__file__).resolve().parents[1] / "src" / "metagen"
# packages whose `__init__` still defines its own `__getattr__`, left for later (the list only shrinks)
OWN_GETATTR: set[str] = set()


def _package(init: Path) -> str:
    return ".".join(("metagen", *init.parent.relative_to(SOURCE).parts))


def _inits() -> dict[str, ast.Module]:
    """package -> the parsed body of its `__init__.py`."""
    return {_package(init): ast.parse(init.read_text(encoding="utf-8")) for init in sorted(SOURCE.rglob("__init__.py"))}


def _calls_lazy_package(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
               and isinstance(node.value.func, ast.Name) and node.value.func.id == "lazy_package" for node in tree.body)


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether the module body defines function `name` or assigns `name`."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


LAZY = sorted(package for package, tree in _inits().items() if _calls_lazy_package(tree))


def test_the_lazy_packages_are_found():
    assert LAZY == ["metagen", "metagen.decoding", "metagen.models", "metagen.remote", "metagen.retrieval",
                    "metagen.sampling", "metagen.scoring", "metagen.speculative", "metagen.strategies", "metagen.structured", "metagen.theory"]


def test_no_package_rolls_its_own_lazy_exports():
    """An export table (`_EXPORTS`) goes through `lazy_package`; a package `__getattr__` is the
    mechanism's, not the package's own."""
    inits = _inits()
    own_getattr = {package for package, tree in inits.items() if _defines(tree, "__getattr__")}
    assert own_getattr == OWN_GETATTR
    tables = {package for package, tree in inits.items() if _defines(tree, "_EXPORTS")}
    assert tables == set(LAZY)


@pytest.mark.parametrize("name", LAZY)
def test_every_name_of_a_lazy_table_resolves_to_its_submodules_object(name):
    package = importlib.import_module(name)
    assert isinstance(package, LazyPackage)
    exports = package.__dict__["_EXPORTS"]
    assert exports
    for exported, submodule in exports.items():
        defining = importlib.import_module(f"{name}.{submodule}")
        assert getattr(package, exported) is getattr(defining, exported), (name, exported, submodule)
    for exported in package.__all__:  # __all__ names the table's names and those the package defines
        assert exported in exports or exported in package.__dict__, (name, exported)
    assert set(exports) <= set(dir(package))
