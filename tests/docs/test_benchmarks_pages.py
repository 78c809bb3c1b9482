"""BENCHMARKS.md and the site's benchmark pages tell one story: the current-figures tables are the
same text in both, and every area page they point to exists and is in the site's navigation."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- current-figures:start", "<!-- current-figures:end -->"


def _current_figures(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"{path}: one current-figures region expected"
    return text[text.index(START):text.index(END)]


def test_current_figures_are_the_same_in_benchmarks_md_and_the_site():
    assert _current_figures(ROOT / "BENCHMARKS.md") == _current_figures(ROOT / "docs/benchmarks/index.md")


def test_every_area_page_is_linked_from_both_and_in_the_nav():
    from_readme = set(re.findall(r"\]\(docs/benchmarks/([\w-]+\.md)\)", (ROOT / "BENCHMARKS.md").read_text()))
    from_index = set(re.findall(r"\]\(([\w-]+\.md)\)", (ROOT / "docs/benchmarks/index.md").read_text()))
    on_disk = {path.name for path in (ROOT / "docs/benchmarks").glob("*.md")} - {"index.md"}
    nav = set(re.findall(r"benchmarks/([\w-]+\.md)", (ROOT / "mkdocs.yml").read_text())) - {"index.md"}
    assert from_readme == from_index == on_disk == nav
