"""The architecture overview and the design notes name only what exists, and the overview stays short.

Every repository path the pages name (`src/...`, `tests/...`, `docs/...`, `benchmarks/...`) must
exist, and every dotted name `metagen.x.y` must resolve to a module, or to a name a module defines
(read from its source with `ast`, so nothing heavy is imported); a code span `Class.member` of a
class metagen defines must name a member of it or of its bases. The drawing of the floors in
docs/ARCHITECTURE.md lists after `->` the packages each package imports; that list must equal the
imports tests/test_floors.py finds in the code. The overview is read in 20 minutes: at most
3,300 words.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.test_floors import FLOOR_MARKER, _package, drawing_entries, floors, module_graph

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
OVERVIEW = ROOT / "docs" / "ARCHITECTURE.md"
NOTES = sorted((ROOT / "docs" / "design").glob("*.md"))
PAGES = [OVERVIEW, *NOTES]
MAX_OVERVIEW_WORDS = 3300

# a repository path; a placeholder such as `<name>` inside it makes it a pattern, not a path
PATH = re.compile(r"(?<![\w/.$-])((?:src|tests|docs|benchmarks)/[\w./<>-]*)")
DOTTED = re.compile(r"(?<![\w.])(metagen(?:\.\w+)+)")


def named_paths(text: str) -> set[str]:
    """The repository paths `text` names (trailing punctuation dropped; patterns left out)."""
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if "<" not in path and ">" not in path:
            found.add(path)
    return found


def missing_paths(text: str) -> list[str]:
    return sorted(path for path in named_paths(text) if not (ROOT / path).exists())


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _module_file(parts: list[str]) -> Path | None:
    base = SOURCE.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body binds: definitions, assignments, imports, `_EXPORTS` /
    `__all__` entries (lazily exported names)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id in ("_EXPORTS", "__all__") and isinstance(node.value, (ast.Dict, ast.List, ast.Tuple)):
                        names |= set(ast.literal_eval(node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= _defined(node.body)
    return names


def resolves(dotted: str) -> bool:
    """`metagen.a.b` is a module, or the longest module prefix defines the rest (a name, then a
    class member)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        path = _module_file(parts[:split])
        if path is None:
            continue
        rest, body = parts[split:], _tree(path).body
        for name in rest:
            if name not in _defined(body):
                return False
            classes = [node for node in body if isinstance(node, ast.ClassDef) and node.name == name]
            body = classes[0].body if classes else []
        return True
    return False


@cache
def class_members() -> dict[str, tuple[set[str], list[str]]]:
    """class name -> (the names its body and its methods' `self.x = ...` bind, its base classes'
    names), over every class under src/metagen (classes of one name merged)."""
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for path in (SOURCE / "metagen").rglob("*.py"):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            members, bases = classes.setdefault(node.name, (set(), []))
            members |= _defined(node.body)
            bases += [base.id for base in node.bases if isinstance(base, ast.Name)]
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) \
                        and isinstance(inner.value, ast.Name) and inner.value.id == "self":
                    members.add(inner.attr)
    return classes


def member_exists(class_name: str, member: str) -> bool:
    """`member` is bound by the class or one of its bases (by name, within src/metagen)."""
    seen, todo = set(), [class_name]
    while todo:
        name = todo.pop()
        if name in seen or name not in class_members():
            continue
        seen.add(name)
        members, bases = class_members()[name]
        if member in members:
            return True
        todo += bases
    return False


# `Class.member` or `Class.member(...)` in a code span, for a class metagen defines
MEMBER = re.compile(r"`([A-Z]\w*)\.(\w+)(?:\([^`]*\))?`")


def unknown_members(text: str) -> list[str]:
    return sorted({f"{cls}.{member}" for cls, member in MEMBER.findall(text)
                   if cls in class_members() and not member_exists(cls, member)})


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_named_path_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert named_paths(text), f"{page_id(page)} names no repository path: is the pattern still right?"
    assert not missing_paths(text), f"{page_id(page)} names paths that do not exist: {missing_paths(text)}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_dotted_name_resolves(page: Path) -> None:
    names = set(DOTTED.findall(page.read_text(encoding="utf-8")))
    unresolved = sorted(name for name in names if not resolves(name))
    assert not unresolved, f"{page_id(page)} names what the code does not define: {unresolved}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_named_class_member_exists(page: Path) -> None:
    unknown = unknown_members(page.read_text(encoding="utf-8"))
    assert not unknown, f"{page_id(page)} names members its classes do not have: {unknown}"


def test_the_overview_is_short() -> None:
    words = len(OVERVIEW.read_text(encoding="utf-8").split())
    assert words <= MAX_OVERVIEW_WORDS, f"docs/ARCHITECTURE.md has {words} words (at most {MAX_OVERVIEW_WORDS})"


def test_the_design_notes_are_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    overview = OVERVIEW.read_text(encoding="utf-8")
    for note in NOTES:
        assert f"design/{note.name}" in nav, f"design/{note.name} is not in mkdocs.yml's nav"
        assert f"(design/{note.name})" in overview, f"docs/ARCHITECTURE.md does not link design/{note.name}"


def drawn_imports() -> dict[str, set[str]]:
    """package -> the packages its entry in the drawing lists after `->`."""
    listed = {}
    for package, text in drawing_entries().items():
        assert "->" in text, f"the drawing lists no imports for {package}"
        after = FLOOR_MARKER.sub("", text.split("->", 1)[1].strip())
        listed[package] = set() if after.strip() == "(none)" else set(after.split())
    return listed


def test_the_drawing_lists_what_each_package_imports() -> None:
    drawn, packages = drawn_imports(), floors()
    actual: dict[str, set[str]] = {package: set() for package in packages}
    for module, targets in module_graph().items():
        source = _package(module)
        if source not in actual:
            continue
        actual[source] |= {_package(t) for t in targets if _package(t) in packages and _package(t) != source}
    assert drawn.keys() == actual.keys()
    wrong = {package: (sorted(drawn[package]), sorted(actual[package]))
             for package in actual if drawn[package] != actual[package]}
    assert not wrong, f"the drawing's imports differ from the code's (drawn, actual): {wrong}"


def test_the_checks_can_fail() -> None:
    """A missing file, a missing name and a misdrawn import are found."""
    text = "see `src/metagen/decoding/rows.py` and `src/metagen/decoding/no_such_loop.py`, `tests/<name>.py`."
    assert missing_paths(text) == ["src/metagen/decoding/no_such_loop.py"]
    assert resolves("metagen.decoding.batch.RowBatch.keep")
    assert resolves("metagen.generate")  # a lazily exported name
    assert not resolves("metagen.decoding.batch.RowBatch.no_such_method")
    assert not resolves("metagen.decoding.no_such_module")
    assert unknown_members("`RowBatch.keep`, `RowBatch.nothing(x)`, `LocalGenerator.generate`, `Foreign.x`") \
        == ["RowBatch.nothing"]
    assert member_exists("SpeculativeGenerator", "reset_prefix_cache")  # inherited from LocalGenerator
