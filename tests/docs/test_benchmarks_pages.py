"""The benchmark figures tell one story: the current figures live in one place (the site's
benchmarks page), BENCHMARKS.md and the README link to it, every figure a README headline row
quotes is in it, and every area page is linked from both benchmark indexes and in the site's
navigation."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- current-figures:start", "<!-- current-figures:end -->"
CURRENT = ROOT / "docs/benchmarks/index.md"


def _current_figures() -> str:
    text = CURRENT.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"{CURRENT}: one current-figures region expected"
    return text[text.index(START):text.index(END)]


def _headline_rows() -> list[list[str]]:
    """The README's headline table, one list of cells per row (header and rule left out)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Headline numbers"):]
    section = section[:section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_current_figures_are_in_one_place():
    _current_figures()
    others = [ROOT / "BENCHMARKS.md", ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    copies = [path for path in others if path != CURRENT and START in path.read_text(encoding="utf-8")]
    assert not copies, f"a second copy of the current figures: {copies}"
    link = "docs/benchmarks/index.md#current-figures"
    assert link in (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert link in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_headline_figure_is_a_current_figure():
    current = _current_figures()
    rows = _headline_rows()
    assert len(rows) >= 5
    for cells in rows:
        # the measured figures of metagen and of the peer (the ratio column may be derived)
        figures = re.findall(r"\d[\d,]*\.\d+", cells[1] + " " + cells[2])
        assert figures, f"README headline row without a figure: {cells[0]}"
        missing = [figure for figure in figures if figure not in current]
        assert not missing, f"README headline row {cells[0]!r} quotes {missing}, not in the current figures"


def test_every_area_page_is_linked_from_both_and_in_the_nav():
    from_readme = set(re.findall(r"\]\(docs/benchmarks/([\w-]+\.md)\)", (ROOT / "BENCHMARKS.md").read_text()))
    from_index = set(re.findall(r"\]\(([\w-]+\.md)\)", CURRENT.read_text()))
    on_disk = {path.name for path in (ROOT / "docs/benchmarks").glob("*.md")} - {"index.md"}
    nav = set(re.findall(r"benchmarks/([\w-]+\.md)", (ROOT / "mkdocs.yml").read_text())) - {"index.md"}
    assert from_readme == from_index == on_disk == nav
