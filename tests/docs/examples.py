"""The executed examples of the documentation (docs/**/*.md): how a page marks a block to run
and the output it claims, read into `Example`s that tests/docs/test_examples.py runs.

A fenced block right after an HTML comment (invisible on the site) is executed:

    <!-- run -->            the next ```python or ```bash block runs; it must not fail
    <!-- run slow -->       the same, marked slow (it loads a model; still run in CI)
    <!-- run serve -->      the same, with `metagen serve` of the embedded model running on a free
                            port of 127.0.0.1: "127.0.0.1:8000" in the block is rewritten to it
    <!-- run install=core -->          the same, as on an install of metagen's core only: the
    <!-- run install=serve+client -->  modules that only other extras bring in cannot be imported
                            (tests/install_simulation.py); combines with slow / serve
    <!-- output -->         the next fenced block is the output the run block before it prints

Python blocks of one page share one namespace, run in order (as a reader pasting them into one
interpreter would); bash blocks run with the project's interpreter first on PATH, in a fresh
temporary directory per page. A claimed output is compared line by line after stripping trailing
spaces; a line `...` stands for any number of lines and `...` inside a line for any text, so a
page claims only what is deterministic. An `<!-- output -->` block with no run block before it
is an error: every output a page claims is executed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = re.compile(r"^<!--\s*(run(?:\s+(?:slow|serve|install=[\w+-]+))*|output)\s*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Block:
    language: str
    code: str
    line: int  # 1-based line of the opening fence
    flags: frozenset[str] = frozenset()
    output: str | None = None  # the claimed output, when an <!-- output --> block follows

    @property
    def install(self) -> frozenset[str] | None:
        """The extras of `install=a+b` (empty for install=core), None when the block runs with all."""
        for flag in self.flags:
            if flag.startswith("install="):
                named = flag.removeprefix("install=")
                return frozenset() if named == "core" else frozenset(named.split("+"))
        return None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def slow(self) -> bool:
        return any({"slow", "serve"} & block.flags for block in self.blocks)

    @property
    def serve(self) -> bool:
        return any("serve" in block.flags for block in self.blocks)


def _fenced(lines: list[str], start: int) -> tuple[str, str, int]:
    """(language, body, index after the closing fence) of the fenced block opening at `start`."""
    opening = FENCE.match(lines[start].strip())
    if opening is None:
        raise ValueError(f"line {start + 1}: a marker must be followed by a fenced code block")
    fence, language = opening.group(1), opening.group(2)
    body = []
    for index in range(start + 1, len(lines)):
        if lines[index].strip().startswith(fence):
            return language, "\n".join(body) + "\n", index + 1
        body.append(lines[index])
    raise ValueError(f"line {start + 1}: the fenced block is never closed")


def read_page(path: Path) -> Page:
    """The marked blocks of one markdown page; ValueError (with the line) on a malformed marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page, index = Page(path), 0
    while index < len(lines):
        marker = MARKER.match(lines[index].strip())
        if marker is None:
            index += 1
            continue
        kind = marker.group(1).split()
        start = index + 1
        while start < len(lines) and not lines[start].strip():
            start += 1
        try:
            language, body, index = _fenced(lines, start)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        if kind[0] == "output":
            if not page.blocks or page.blocks[-1].output is not None:
                raise ValueError(f"{path}:{start + 1}: an <!-- output --> block with no run block before it")
            page.blocks[-1].output = body
        else:
            if language not in ("python", "py", "bash", "sh", "console"):
                raise ValueError(f"{path}:{start + 1}: cannot run a {language or 'plain'} block")
            page.blocks.append(Block(language, body, start + 1, frozenset(kind[1:])))
    return page


def pages() -> list[Page]:
    """Every page under docs/ with at least one marked block."""
    found = [read_page(path) for path in sorted(DOCS.rglob("*.md"))]
    return [page for page in found if page.blocks]


def matches(claimed: str, printed: str) -> bool:
    """True when `printed` fits `claimed` (trailing spaces ignored, `...` a wildcard: a whole line
    for any number of lines, inside a line for any text)."""
    want = [line.rstrip() for line in claimed.strip("\n").splitlines()]
    have = [line.rstrip() for line in printed.strip("\n").splitlines()]
    pattern = []
    for line in want:
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append(".*?".join(re.escape(part) for part in line.split("...")) + r"\n")
    return re.fullmatch("".join(pattern), "".join(line + "\n" for line in have)) is not None
