"""A safe calculator: arithmetic expressions evaluated by walking Python's `ast`, never `eval`.

    Calculator()("2 ** 10 + 1/4")      # "1024.25"
    Calculator()("sqrt(2) * 3")        # "4.242640687119285"
    Calculator()("__import__('os')")   # "error: function '__import__' is not allowed"

Grammar: numbers; + - * / // % ** (and ^ as power, as models write it); unary + -; parentheses;
the constants pi, e; the functions in `FUNCTIONS`. Anything else (names, attributes, subscripts,
comparisons, keyword arguments, strings) is refused with an error naming it.

Exactness: integers and decimal literals are exact rationals (`fractions.Fraction`), so
7 / 2 = 3.5, 0.1 * 3 = 0.3 and 6 / 3 = 2 exactly; a result that is a whole number prints as an
integer. Irrational functions (sqrt of a non-square, log, sin, ...) and float arguments give
floats. Sizes are bounded: exponents by the bit length of the result (at most `MAX_BITS`),
factorial by `MAX_FACTORIAL`, the expression by `MAX_LENGTH` characters.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from metagen.tools.base import Tool, ToolError

MAX_LENGTH = 1000
MAX_BITS = 14_000  # about 4200 decimal digits (Python prints ints of up to 4300 digits)
MAX_ROUND_DIGITS = 100
MAX_FACTORIAL = 1000
Number = int | Fraction | float


def _sqrt(x: Number) -> Number:
    if isinstance(x, (int, Fraction)) and x >= 0:
        x = Fraction(x)
        root_n, root_d = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if root_n * root_n == x.numerator and root_d * root_d == x.denominator:  # a perfect square
            return Fraction(root_n, root_d)
    if x < 0:
        raise ToolError(f"sqrt of a negative number ({_format(x)})")
    return math.sqrt(x)


def _factorial(n: Number) -> int:
    if not isinstance(n, int) or n < 0:
        raise ToolError(f"factorial needs a non-negative integer, got {_format(n)}")
    if n > MAX_FACTORIAL:
        raise ToolError(f"factorial({n}) is too large (limit {MAX_FACTORIAL})")
    return math.factorial(n)


def _integers(name: str, function):
    def checked(*args):
        if not all(isinstance(a, int) for a in args):
            raise ToolError(f"{name} needs integers")
        return function(*args)

    return checked


def _round(x: Number, digits: Number | None = None) -> Number:
    if digits is not None and (not isinstance(digits, int) or abs(digits) > MAX_ROUND_DIGITS):
        raise ToolError(f"round needs an integer number of digits in [-{MAX_ROUND_DIGITS}, {MAX_ROUND_DIGITS}]")
    return round(x) if digits is None else round(x, digits)


def _log(x: Number, base: Number | None = None) -> float:
    if x <= 0 or (base is not None and (base <= 0 or base == 1)):
        raise ToolError("log needs a positive argument and a positive base other than 1")
    return math.log(x) if base is None else math.log(x) / math.log(base)


FUNCTIONS = {
    "sqrt": _sqrt, "abs": abs, "round": _round, "min": min, "max": max,
    "floor": math.floor, "ceil": math.ceil, "factorial": _factorial,
    "gcd": _integers("gcd", math.gcd), "lcm": _integers("lcm", math.lcm),
    "log": _log, "ln": _log, "log10": lambda x: _log(x, 10), "log2": lambda x: _log(x, 2),
    "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan,
}
CONSTANTS = {"pi": math.pi, "e": math.e}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: None}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
SPELLINGS = {"^": "**", "×": "*", "÷": "/", "−": "-"}


def evaluate(expression: str) -> Number:
    """The exact (or float) value of an arithmetic expression; ToolError for anything refused."""
    text = expression.strip().rstrip("=").strip()
    for written, meant in SPELLINGS.items():
        text = text.replace(written, meant)
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_LENGTH:
        raise ToolError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ToolError(f"not an arithmetic expression: {getattr(error, 'msg', error)}") from None
    try:
        return _reduce(_value(tree.body))
    except RecursionError:
        raise ToolError("expression nested too deeply") from None


def _value(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"{node.value!r} is not a number")
        if isinstance(node.value, float):
            if not math.isfinite(node.value):
                raise ToolError("number too large")
            return _reduce(Fraction(str(node.value)))  # the decimal as written: 0.1 is 1/10
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        if isinstance(node.op, ast.Div) and not isinstance(left, float) and not isinstance(right, float):
            return _reduce(Fraction(left) / Fraction(right))
        return _reduce(_bounded(BINARY[type(node.op)](left, right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ToolError(f"name {node.id!r} is not allowed")
    if isinstance(node, ast.Attribute) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        raise ToolError("attribute access is not allowed")
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in FUNCTIONS:
            shown = name or ast.unparse(node.func)
            raise ToolError(f"function {shown!r} is not allowed (allowed: {', '.join(FUNCTIONS)})")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ToolError(f"{name}() takes plain positional arguments only")
        return _reduce(_bounded(FUNCTIONS[name](*[_value(a) for a in node.args])))
    raise ToolError(f"{type(node).__name__.lower()} is not allowed: {ast.unparse(node)}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        exponent = exponent.numerator
    if isinstance(exponent, int) and not isinstance(base, float):
        base = Fraction(base)
        size = max(base.numerator.bit_length(), base.denominator.bit_length())
        if abs(exponent) * max(size - 1, 0) > MAX_BITS:  # |b|^n has about n·log2|b| bits
            raise ToolError(f"result too large (more than {MAX_BITS} bits)")
        if base == 0 and exponent < 0:
            raise ToolError("division by zero")
        return _reduce(_bounded(base**exponent))
    if float(base) < 0:
        raise ToolError("a negative number to a fractional power is not a real number")
    try:
        return _bounded(float(base) ** float(exponent))
    except OverflowError:
        raise ToolError("result too large") from None


def _bounded(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not finite")
    if isinstance(value, (int, Fraction)):
        fraction = Fraction(value)
        if max(fraction.numerator.bit_length(), fraction.denominator.bit_length()) > MAX_BITS:
            raise ToolError(f"result too large (more than {MAX_BITS} bits)")
    return value


def _reduce(value: Number) -> Number:
    """Whole rationals as int."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    return value


def _format(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Fraction):
        return repr(float(value))
    return repr(value)


class Calculator(Tool):
    """Evaluates one arithmetic expression (see the module docstring); the result as text."""

    name = "calculator"
    description = (
        "Evaluates an arithmetic expression exactly: + - * / // % ** and parentheses, "
        "with sqrt, abs, round, min, max, floor, ceil, log, exp, sin, cos, tan, factorial, gcd. "
        "Example: (12 * 7 + 3) / 4"
    )

    def run(self, text: str) -> str:
        return _format(evaluate(text))
