"""The floors of docs/ARCHITECTURE.md hold: no import cycle, and no package uses a higher floor.

A static scan (ast) of every module under src/metagen: every `import` and `from ... import` counts,
wherever it stands (module level, inside a function, under `if TYPE_CHECKING`). An import inside a
function only delays the dependency, it does not remove it: a lower floor that imports a higher
one lazily still cannot be understood, tested or reused without it. Names a package exports
lazily (`_EXPORTS = {name: submodule}` in its `__init__`) resolve to the submodule defining them,
so `from metagen.decoding import Row` is an edge to `metagen.decoding.rows`.

Checked: the package graph has no cycle and no edge to a higher floor (the `faces` sit above every
numbered floor; packages of one floor may use each other as long as no cycle forms); the module
graph has no cycle (two modules of one package importing each other).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "metagen"
FACES = 99  # above every numbered floor

# Package cycles known and left for later; each entry must still exist (the list only shrinks).
KNOWN_PACKAGE_CYCLES: list[list[str]] = []
# Module cycles inside one package, left for later (none now; an entry must still exist).
KNOWN_MODULE_CYCLES: list[list[str]] = []


FLOOR_MARKER = re.compile(r"\((floor (\d+)|faces)\)\s*$")


def drawing_entries() -> dict[str, str]:
    """package (or top-level module) -> the text of its entry in the tree of docs/ARCHITECTURE.md:
    its lines joined, from its name through its floor marker."""
    tree = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("```", 2)[1]
    entries: dict[str, str] = {}
    name = None
    for line in tree.splitlines():
        entry = re.match(r"^  (\w+)(/|\.py)\s", line)
        if entry:
            name = entry.group(1)
            entries[name] = ""
        if name is not None:
            entries[name] += " " + line
            if FLOOR_MARKER.search(line):
                name = None
    return entries


def floors() -> dict[str, int]:
    """package (or top-level module) -> floor, read from the tree of docs/ARCHITECTURE.md."""
    found: dict[str, int] = {}
    for name, text in drawing_entries().items():
        marker = FLOOR_MARKER.search(text)
        if marker:
            found[name] = int(marker.group(2)) if marker.group(2) else FACES
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exports(tree: ast.Module, package: str) -> dict[str, str]:
    """A lazy package's `_EXPORTS`: name -> the module defining it."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {name: f"{package}.{target}" for name, target in ast.literal_eval(node.value).items()}
    return {}


@cache
def module_graph() -> dict[str, set[str]]:
    """module -> the metagen modules it imports (anywhere in its body)."""
    trees = {_module_name(path): (path, ast.parse(path.read_text(), str(path))) for path in SOURCE.rglob("*.py")}
    exports = {name: _exports(tree, name) for name, (path, tree) in trees.items() if path.name == "__init__.py"}

    def resolve(target: str, names: list[str]) -> set[str]:
        if target not in exports:
            return {target}
        out = set()
        for name in names:
            if f"{target}.{name}" in trees:  # a submodule
                out.add(f"{target}.{name}")
            else:
                out.add(exports[target].get(name, target))
        return out

    graph: dict[str, set[str]] = defaultdict(set)
    for module, (path, tree) in trees.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        graph[module] |= set(exports.get(module, {}).values()) - {module}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] == "metagen":
                    graph[module] |= resolve(target, [alias.name for alias in node.names])
            elif isinstance(node, ast.Import):
                graph[module] |= {alias.name for alias in node.names if alias.name.split(".")[0] == "metagen"}
        graph[module].discard(module)
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative). O(V + E)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_architecture_lists_every_package_with_its_floor() -> None:
    listed = floors()
    packages = {path.parent.name for path in SOURCE.glob("*/__init__.py")}
    assert packages <= set(listed), f"packages without a floor in docs/ARCHITECTURE.md: {sorted(packages - set(listed))}"


def test_no_package_imports_a_higher_floor() -> None:
    listed = floors()
    upward = []
    for module, targets in module_graph().items():
        source = _package(module)
        for target in targets:
            destination = _package(target)
            if source == destination or not destination or not source:
                continue
            # a top-level helper module not in the tree (_lazy, json_depth, jsonl, plotting) is floor 0
            if listed.get(destination, 0) > listed.get(source, 0):
                upward.append(f"{module} (floor {listed.get(source, 0)}) -> {target} (floor {listed[destination]})")
    assert not upward, "imports of a higher floor:\n" + "\n".join(sorted(upward))


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in module_graph().items():
        packages[_package(module)] |= {_package(t) for t in targets if _package(t) != _package(module)}
    packages.pop("", None)  # metagen/__init__.py: the lazy table of the top-level names
    found = [sorted(component) for component in cycles(packages)]
    new = [component for component in found if component not in KNOWN_PACKAGE_CYCLES]
    assert not new, f"package import cycles: {new}"
    assert all(known in found for known in KNOWN_PACKAGE_CYCLES), "a known cycle is gone: remove it from the list"


def test_no_import_cycle_between_modules() -> None:
    found = [sorted(component) for component in cycles(module_graph())]
    new = [component for component in found if component not in [sorted(c) for c in KNOWN_MODULE_CYCLES]]
    assert not new, f"module import cycles: {new}"
    assert all(sorted(known) in found for known in KNOWN_MODULE_CYCLES), "a known cycle is gone: remove it from the list"


def test_the_scan_finds_a_cycle_and_a_lazy_export() -> None:
    """The checks above can fail: a planted cycle is found, and a lazily exported name resolves to
    its defining module."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = module_graph()
    assert "metagen.decoding.rows" in graph["metagen.decoding.batch"]
    assert "metagen.sampling.params" in graph["metagen.decoding.generator"]  # `from metagen.sampling import SamplingParams`
