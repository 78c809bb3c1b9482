"""Equations written in a reasoning step, checked exactly: `3 + 4 × 2 = 11` → holds.

An equation is an arithmetic expression of numbers, + − × ÷ * / x and parentheses, then `=`,
then a number. `×`, `x` (between numbers) and `÷` are read as * and /; thousands separators
(1,000) are removed. The left side is evaluated by the exact calculator (rationals), so
`7 / 2 = 3.5` holds and `7 / 2 = 3` does not. O(length of the step): the equation pattern runs
on RE2 (`answers.compile_pattern`); on Python's backtracking re its adjacent runs of spaces made
"1 + 1 + ... + 1" with no "=" take 2^terms steps (12 terms: 23 s holding the interpreter).
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_OPERATOR = r"[-+*/×÷xX]"
_EQUATION = (  # RE2 syntax (\d: 0-9)
    rf"(?P<left>\(?\s*{_NUMBER}\s*\)?(?:\s*{_OPERATOR}\s*\(?\s*{_NUMBER}\s*\)?)+)\s*=\s*(?P<right>-?{_NUMBER})"
)


def _normalise(expression: str) -> str:
    expression = expression.replace(",", "").replace("×", "*").replace("÷", "/")
    # re, not RE2 (no lookaround there); linear: one-character lookarounds, O(1) per position
    return re.sub(r"(?<=[\d\s)])[xX](?=[\s\d(])", "*", expression)


def find_equations(text: str) -> list[tuple[str, str, bool]]:
    """(left side, stated result, whether it holds) for every equation in `text`, in order.

    A left side the calculator refuses (division by zero, unbalanced parentheses) does not hold.
    """
    from metagen.scoring.answers import compile_pattern
    from metagen.tools.calculator import evaluate

    found = []
    for match in compile_pattern(_EQUATION).finditer(text):
        left, right = match.group("left").strip(), match.group("right")
        try:
            value = evaluate(_normalise(left))
            holds = Fraction(value) == Fraction(right.replace(",", ""))
        except Exception:  # the calculator's refusals (ToolError, ZeroDivisionError, SyntaxError)
            holds = False
        found.append((left, right, holds))
    return found
