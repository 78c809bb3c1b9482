"""Tests as checks a program cannot fake: each `assert` is split into the expression the program
computes (evaluated in the sandbox) and the expected side, which never enters the sandbox and is
compared with the reported value here, in the caller, on plain Python values.

A test is Python statements; its top-level asserts are its checks, each of one of these forms
(L: a literal, anything `ast.literal_eval` reads; E: any expression, evaluated in the sandbox):

    assert E == L            also !=, <, <=, >, >=, in, not in, with L on either side
    assert E is None         also is not None, is True, is False
    assert math.isclose(E, L, rel_tol=L, abs_tol=L)      (or isclose(...), E and L in either order)
    assert f(...)            f(...), f.x or f[...] of a name f of the program's: not a builtin, and
                             not bound by setup or by the test itself
    assert not <any of the above>

Why these and no others: the program shares its process with the harness, so it can rewrite the
harness, forge its records or exit early; all it can claim is "E evaluated to v". With L kept
out of its reach, v equals L only if the program computed L; no object of the program takes part
in the comparison (v is rebuilt here from JSON: None, bool, int, float, complex, str, bytes and
lists, tuples, sets, dicts of them), so an `__eq__` that always says True cannot help. A bare
assert hides only its polarity (truthy or falsy), so it is accepted only on what the program
itself returns, where "always truthy" is an answer the program could give honestly; on the
test's own logic (`f(1) == 2 and f(2) == 4`, `isinstance(f(1), int)`, a setup helper) the
program would just report True, so such asserts, asserts comparing two computed values, asserts
nested in blocks (loops, functions) and tests without an assert are refused with a ValueError.
Other statements run in the sandbox before the checks that follow them: they can fail a test by
raising, never pass it.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
from dataclasses import dataclass

SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
           ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
           "is": operator.is_, "is not": operator.is_not}
FORMS = ("accepted asserts: `assert E == L` (!=, <, <=, >, >=, in, not in; L on either side), "
         "`assert E is None` (is not, True, False), `assert math.isclose(E, L, rel_tol=L, abs_tol=L)`, "
         "`assert f(...)` (or f.x, f[...]) with f a name of the program's, and `assert not` any of these; "
         "L a literal (ast.literal_eval), E evaluated in the sandbox")


@dataclass(frozen=True)
class Check:
    """One assert: `E relation L` (L first when `expected_first`), negated by `not`."""

    test: int
    line: int
    expression: str
    relation: str  # a COMPARE symbol, "isclose" or "truthy"
    expected: object = None
    expected_first: bool = False
    negated: bool = False
    tolerances: tuple[tuple[str, float], ...] = ()

    def holds(self, value) -> bool:
        """Whether the reported value passes; TypeError (etc.) when it cannot be compared."""
        if self.relation == "truthy":
            result = bool(value)
        elif self.relation == "isclose":
            if type(value) not in (int, float, bool):
                raise TypeError(f"math.isclose needs a number, not {type(value).__name__}")
            result = math.isclose(value, self.expected, **dict(self.tolerances))
        else:
            compare = COMPARE[self.relation]
            result = compare(self.expected, value) if self.expected_first else compare(value, self.expected)
        return bool(result) != self.negated


def plan_tests(tests: list[str], setup: str) -> tuple[list[list[dict]], list[Check]]:
    """Each test's steps for the harness ({"exec": statement} or {"eval": E, "check": k}) and all
    checks, indexed by k. Raises ValueError naming the test and line of anything not accepted."""
    try:
        setup_names = _bound_names(ast.parse(setup).body)
    except SyntaxError as error:
        raise ValueError(f"setup does not compile: {error}") from None
    steps, checks = [], []
    for index, text in enumerate(tests):
        where = f"tests[{index}]"
        try:
            body = ast.parse(text).body
        except SyntaxError as error:
            raise ValueError(f"{where} does not compile: {error}") from None
        foreign = setup_names | _bound_names(body) | set(dir(builtins))
        test_steps = []
        for node in body:
            pad = "\n" * (node.lineno - 1)  # tracebacks then give the test's own line numbers
            if not isinstance(node, ast.Assert):
                if any(isinstance(inner, ast.Assert) for inner in ast.walk(node)):
                    raise ValueError(f"{where} line {node.lineno}: an assert inside a block runs in the sandbox, where "
                                     f"the program can fake it; write it as a top-level assert ({FORMS})")
                test_steps.append({"exec": pad + ast.unparse(node)})
                continue
            check = _check(node.test, index, node.lineno, foreign, where)
            test_steps.append({"eval": pad + check.expression, "check": len(checks)})
            checks.append(check)
        if not any("eval" in step for step in test_steps):
            raise ValueError(f"{where} has no assert, so nothing can be checked outside the sandbox ({FORMS})")
        steps.append(test_steps)
    return steps, checks


def _check(node: ast.expr, test: int, line: int, foreign: set[str], where: str) -> Check:
    negated = False
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        node, negated = node.operand, not negated
    found = _compare(node) or _isclose(node)
    if found is None and isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        root = node
        while isinstance(root, (ast.Call, ast.Attribute, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(root, ast.Name) and root.id not in foreign:
            found = (node, "truthy", None, False, ())
    if found is None:
        raise ValueError(f"{where} line {line}: `assert {ast.unparse(node)}` cannot be checked outside the sandbox ({FORMS})")
    expression, relation, expected, expected_first, tolerances = found
    if isinstance(expression, (ast.Compare, ast.BoolOp)):
        raise ValueError(f"{where} line {line}: the checked expression `{ast.unparse(expression)}` must be the "
                         f"program's answer, not a comparison ({FORMS})")
    return Check(test, line, ast.unparse(expression), relation, expected, expected_first, negated, tolerances)


def _literal(node: ast.expr) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _compare(node: ast.expr):
    """(E, relation, L, L first, ()) for `E op L` / `L op E`, else None."""
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or type(node.ops[0]) not in SYMBOLS:
        return None
    symbol = SYMBOLS[type(node.ops[0])]
    left, right = node.left, node.comparators[0]
    (right_literal, right_value), (left_literal, left_value) = _literal(right), _literal(left)
    if right_literal:
        expression, expected, expected_first = left, right_value, False
    elif left_literal:
        expression, expected, expected_first = right, left_value, True
    else:
        return None
    if symbol in ("is", "is not") and expected not in (None, True, False):
        return None
    return expression, symbol, expected, expected_first, ()


def _isclose(node: ast.expr):
    """(E, "isclose", L, L first, tolerances) for math.isclose(E, L, ...), else None."""
    if not (isinstance(node, ast.Call) and len(node.args) == 2 and ast.unparse(node.func) in ("math.isclose", "isclose")):
        return None
    tolerances = []
    for keyword in node.keywords:
        known, value = _literal(keyword.value)
        if keyword.arg not in ("rel_tol", "abs_tol") or not known or type(value) not in (int, float):
            return None
        tolerances.append((keyword.arg, value))
    (second_literal, second), (first_literal, first) = _literal(node.args[1]), _literal(node.args[0])
    if second_literal and type(second) in (int, float):
        return node.args[0], "isclose", second, False, tuple(tolerances)
    if first_literal and type(first) in (int, float):
        return node.args[1], "isclose", first, True, tuple(tolerances)
    return None


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """Names that top-level statements bind (assignments, loops, with, defs, classes, imports),
    not looking into the bodies of functions, classes and lambdas (their own scopes)."""
    names, todo = set(), list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return names
