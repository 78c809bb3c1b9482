"""`metagen.tables`: one table, rendered as aligned text or as a Markdown pipe table, with the
same cells; malformed tables named."""

from __future__ import annotations

import pytest

from metagen.tables import Table, table, with_notes


def test_text_pads_each_column_to_its_widest_cell_and_aligns_as_asked():
    shown = Table(["name", "n"], [["greedy", "1"], ["self_consistency", "16"]], ["left", "right"]).text()
    assert shown.splitlines() == ["name               n",
                                  "--------------------",
                                  "greedy             1",
                                  "self_consistency  16"]
    assert Table(["a"], [["x"]], indent=2).text().splitlines() == ["  a", "  -", "  x"]


def test_markdown_escapes_pipes_and_marks_right_aligned_columns():
    shown = table(["cell", "value"], [["a|b", "1"], ["two\nlines", "22"]], markdown=True, align=["left", "right"])
    assert shown.splitlines() == ["| cell | value |", "|---|---:|", "| a\\|b | 1 |", "| two lines | 22 |"]
    assert Table(["x"], []).markdown() == "| x |\n|---|"


def test_notes_follow_the_table_as_lines_or_as_a_list():
    assert with_notes("T", [], markdown=True) == "T"
    assert with_notes("T", ["one", "two"], markdown=False) == "T\none\ntwo"
    assert with_notes("T", ["one"], markdown=True) == "T\n\n- one"  # a line under a pipe table would join it


@pytest.mark.parametrize("header, rows, align, named", [
    ([], [], None, "header is empty"),
    (["a", "b"], [["1"]], None, "rows[0] has 1 cells: the header has 2 columns"),
    (["a"], [["1"]], ["left", "right"], "align has 2 entries: the header has 1 columns"),
    (["a"], [["1"]], ["centre"], "align[0]='centre': must be one of left, right"),
])
def test_malformed_tables_are_named(header, rows, align, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Table(header, rows, align)
