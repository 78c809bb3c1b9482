"""One table, two renderings: aligned plain text for a terminal, Markdown (GitHub's pipe tables)
for a page. Every table metagen prints (`metagen eval`'s summaries) and the benchmarks' reports
are built as a `Table` and rendered here, so the two forms always hold the same cells.

Light: no imports beyond the standard library (the CLI's summaries use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGNS = ("left", "right")


@dataclass(frozen=True)
class Table:
    """header: the column names; rows: one cell per column (text, already formatted); align:
    "left" or "right" per column (default: all left); indent: spaces before every plain-text
    line (Markdown has none)."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    align: Sequence[str] | None = None
    indent: int = 0

    def __post_init__(self) -> None:
        width = len(self.header)
        if width == 0:
            raise ValueError("header is empty: a table needs at least one column")
        for number, row in enumerate(self.rows):
            if len(row) != width:
                raise ValueError(f"rows[{number}] has {len(row)} cells: the header has {width} columns")
        if self.align is not None:
            if len(self.align) != width:
                raise ValueError(f"align has {len(self.align)} entries: the header has {width} columns")
            for number, side in enumerate(self.align):
                if side not in ALIGNS:
                    raise ValueError(f"align[{number}]={side!r}: must be one of {', '.join(ALIGNS)}")
        if self.indent < 0:
            raise ValueError(f"indent={self.indent}: must be >= 0")

    def _sides(self) -> list[str]:
        return list(self.align) if self.align is not None else ["left"] * len(self.header)

    def text(self) -> str:
        """Columns padded to their widest cell, two spaces apart, a rule of dashes under the
        header; trailing spaces stripped."""
        sides = self._sides()
        lines = [list(self.header), *[list(row) for row in self.rows]]
        widths = [max(len(line[i]) for line in lines) for i in range(len(self.header))]

        def laid(line: list[str]) -> str:
            cells = (cell.rjust(w) if side == "right" else cell.ljust(w) for cell, w, side in zip(line, widths, sides))
            return (" " * self.indent + "  ".join(cells)).rstrip()

        rule = " " * self.indent + "-" * (sum(widths) + 2 * (len(widths) - 1))
        return "\n".join([laid(lines[0]), rule, *map(laid, lines[1:])])

    def markdown(self) -> str:
        """A pipe table: '|' inside a cell escaped, newlines as spaces, right-aligned columns
        marked '---:'."""
        rule = "|" + "|".join("---:" if side == "right" else "---" for side in self._sides()) + "|"
        return "\n".join([_row(self.header), rule, *map(_row, self.rows)])

    def render(self, markdown: bool = False) -> str:
        return self.markdown() if markdown else self.text()


def with_notes(table: str, notes: Sequence[str], markdown: bool) -> str:
    """A table with its notes under it: one per line in plain text; in Markdown, a blank line
    and a list (a line right under a pipe table would join its last row)."""
    if not notes:
        return table
    if markdown:
        return table + "\n\n" + "\n".join(f"- {note}" for note in notes)
    return "\n".join([table, *notes])


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False,
          align: Sequence[str] | None = None) -> str:
    """`Table(header, rows, align).render(markdown)`: the one-call form the reports use."""
    return Table(header, rows, align).render(markdown)
