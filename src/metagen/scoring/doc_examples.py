"""The examples a code problem's docstrings write, as checks a program can be run on.

A HumanEval-form prompt shows the function to write with a docstring, which often gives a few
calls and their results. These ways of writing them are read:

  - doctest: `>>> expression` (continued by `... ` lines), then the expected value on the lines
    up to a blank line, the next `>>>` or the docstring's end; no expected line means the call
    returns None (doctest prints nothing for None: HumanEval/12's `>>> longest([])`);
  - inline: `call SEP value` on one line (a call's brackets may go on over the next lines),
    SEP one of `==`, `==>`, `=>`, `->`, `➞`, `=`, `returns`, `should return` (a `#` before it
    is allowed, so is text before the call: `for f(1) == 2`, `* f([]) => []`); several on one
    line are read one after the other. The value may be spelled `true` / `false`, or worked
    out: "f(x) -> 19 - 5 - 6 = 8" is kept when the arithmetic gives the literal after its last
    `=`. A docstring that defines its function by formulas with `=` (a `call = ...` that is
    not an example: "tri(n) = 1 + n / 2") keeps none of its `=` lines ("tri(1) = 3" is a term
    of the recurrence, not what tri(1) returns). When the prompt defines one function, a call
    of a name it does not define (and no builtin) in such a line is read as a call of that
    function (HumanEval/81's `grade_equation(...)` for `numerical_letter_grade`);
  - prose, as arguments and a value of the entry point: "Input: arr = [1, 2], k = 3" then
    "Output: [2]" on a later line (up to MAX_INPUT_LINES), and "For lst = [1, 2] the output
    should be 5" ("the result should be"; prose may stand before "the"). The arguments are
    `name = value` or `name : value` items or bare values, separated by commas or lines: items
    naming every parameter are put in the parameters' order, else as many items as there are
    parameters are taken in the order written.

A prompt that defines no function (MBPP's: a docstring with the task and `assert f(x) == v`)
has its examples read as calls of the functions its `assert` lines call.

HumanEval's 164 prompts: 30 give no example in the first two forms; with the rest read, 8 do
(38, 41, 50, 83: none written; 80: unquoted strings; 105, 160: worked prose; 130: formulas),
and the examples go from 382 to 449, every one satisfied by the canonical solution but those of
the three problems whose docstrings are wrong (`tests/scoring/test_doc_examples.py`).

An example is kept when its expression parses, calls a function the prompt defines (the entry
point or a helper) and reads no name but those functions and builtins (`fib4(n) -> ...` is not
one), and its value is a Python literal (`ast.literal_eval`; `truth`, `1 + 9 = 11` are not);
after an inline value only the line's end, punctuation, a comment or a parenthesis may follow.
What looks like an example but is not kept is counted in `skipped`, with the reason. Expected
values are compared with ==, as doctest would compare their printed form; a docstring whose
example is wrong (HumanEval has a few) makes a right program fail that example.

Docstrings are read from the source text (escapes such as `\\n` inside a docstring's example
stay as written, so the example reads as the reader sees it). Cost: O(L·W) for L docstring lines
of W characters (a literal is tried at each token end of an inline value).
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import operator
import re
import tokenize
from dataclasses import dataclass, field

from metagen.scoring.code_problems import entry_point_of, function_names

SEPARATORS = ("==>", "=>", "==", "->", "➞", "=", "should return", "returns")
_SEPARATOR = re.compile(r"[ \t]*(?:#[ \t]*)?(==>|=>|==|->|➞|=|should return|returns)(?![=>])[ \t]*")
_TAIL = re.compile(r"[ \t]*(?:$|#|\(|\band\b|\bor\b|[.,;:](?:[ \t]|$))")
_WORD_END = re.compile(r"[ \t]*(?:$|\n|,|;|\b)")  # a literal inside prose: "For x = [1] the output ..."
_BOOLEANS = {"true": True, "false": False}  # JSON's spelling, as docstrings often write them
_WORKED = re.compile(r"([-+*/%() \t\d.]+?)[ \t]*=[ \t]*")  # "19 - 5 - 6 = 8": a worked value
_INPUT = re.compile(r"^[ \t]*Input[ \t]*:[ \t]*(.*)$")
_OUTPUT = re.compile(r"^[ \t]*Output[ \t]*:[ \t]*(.*)$")
_FOR = re.compile(r"\bFor[ \t]+(.+?)\bthe[ \t]+(?:output|result)[ \t]+should[ \t]+be[ \t]+(.*)$")
_ARGUMENT = re.compile(r"[ \t]*([A-Za-z_]\w*)[ \t]*[=:][ \t]*(?![=])")
_ASSERTED = re.compile(r"^[ \t]*assert[ \t]+([A-Za-z_]\w*)[ \t]*\(", re.MULTILINE)
MAX_INPUT_LINES = 10  # lines between "Input:" and "Output:"
MAX_CONTINUATION_LINES = 20  # lines an inline call's brackets may span


@dataclass(frozen=True)
class Example:
    """expression: the call (Python source); expected: its value as written; line: where the
    example starts in the prompt's code (1-based); form: ">>>" or the inline separator."""

    expression: str
    expected: object
    line: int
    form: str

    def test(self) -> str:
        """The example as a test `CodeExecutionVerifier` accepts (the expected value stays
        outside the sandbox)."""
        return f"assert ({self.expression}) == {self.expected!r}"


@dataclass
class DocExamples:
    """examples: the checks found, in order; skipped: (line, text, why) of example-like lines
    that are not kept."""

    examples: list[Example] = field(default_factory=list)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)


def doc_examples(code: str, entry_point: str | None = None) -> DocExamples:
    """The examples in the docstrings of `code` (a prompt's source, see `code_in_prompt`) that call
    a function it defines (`entry_point` included, default `entry_point_of(code)`)."""
    entry = entry_point or entry_point_of(code)
    names = set(function_names(code)) | ({entry} - {None})
    if not names:  # a prompt of MBPP's form: a docstring whose `assert f(...) == v` names the function
        names = set(_ASSERTED.findall(code))
    found = DocExamples()
    if not names:
        return found
    alias = names == {entry}  # one function: a call of an undefined name in an example is a call of it
    called = r"[A-Za-z_]\w*" if alias else "|".join(map(re.escape, sorted(names)))
    call_start = re.compile(r"(?<![\w.])(?:" + called + r")[ \t]*\(")
    parameters = _parameters(code, entry) if entry is not None else None
    for first_line, lines in _docstrings(code):
        _read_doctests(lines, first_line, names, found)
        _read_inline(lines, first_line, names, call_start, found, entry if alias else None)
        if parameters is not None:
            _read_input_output(lines, first_line, entry, parameters, names, found)
            _read_for_should_be(lines, first_line, entry, parameters, names, found)
    found.examples.sort(key=lambda example: example.line)
    return found


def _parameters(code: str, name: str) -> list[str] | None:
    """The positional parameter names of top-level function `name` in `code`, None when not found."""
    for source in (code, code.rstrip() + "\n    pass\n"):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return [argument.arg for argument in node.args.posonlyargs + node.args.args]
        return None
    return None


def _docstrings(code: str) -> list[tuple[int, list[str]]]:
    """(line of its first line, its source lines) of every string literal standing as a
    statement (docstrings); the whole text when `code` does not parse even with a body added."""
    for source in (code, code.rstrip() + "\n    pass\n"):
        try:
            tree = ast.parse(source)
            break
        except (SyntaxError, ValueError):
            continue
    else:
        return [(1, code.splitlines())]
    lines = code.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            start, end = node.lineno, min(node.end_lineno, len(lines))
            found.append((start, lines[start - 1:end]))
    return found


def _read_doctests(lines: list[str], first_line: int, names: set[str], found: DocExamples) -> None:
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if not stripped.startswith(">>>"):
            index += 1
            continue
        line, source = first_line + index, [stripped[3:].strip()]
        index += 1
        while index < len(lines) and lines[index].strip().startswith("..."):
            source.append(lines[index].strip()[3:].strip())
            index += 1
        expected = []
        while index < len(lines):
            text = lines[index].strip().removesuffix('"""').removesuffix("'''").strip()
            if not text or text.startswith(">>>"):
                break
            expected.append(text)
            index += 1
            if lines[index - 1].strip().endswith(('"""', "'''")):
                break
        expression = "\n".join(source).removesuffix('"""').removesuffix("'''").strip()
        why = _call_problem(expression, names, top_call=False)
        form = ">>>"
        if why is None:
            tree = ast.parse(expression, mode="eval").body
            ok, value = _literal("\n".join(expected)) if expected else (True, None)
            why = None if ok else f"the expected output {' '.join(expected)!r} is not a Python literal"
            if why is None and isinstance(tree, ast.Compare):  # `>>> f(x) == y` (then True, or no output)
                tree, value, why, form = _asserted(tree, value)
            elif why is None and not expected and not isinstance(tree, ast.Call):
                why = "it has no expected output, and only a call's None prints nothing"
        if why is None:
            expression = ast.unparse(tree)  # comments and line breaks gone
            found.examples.append(Example(expression, value, line, form))
        else:
            found.skipped.append((line, stripped, why))


def _read_inline(lines: list[str], first_line: int, names: set[str], call_start: re.Pattern,
                 found: DocExamples, alias: str | None) -> None:
    """Inline examples, `call SEP value`. In a docstring where some `call = ...` is not an
    example (a formula: "tri(n) = 1 + n / 2", "tri(3) = tri(2) + tri(1) + tri(4)"), its `=` lines
    define the function rather than show calls of it, and none is kept ("tri(1) = 3" is not
    what tri(1) returns)."""
    here = DocExamples()
    formulas: list[int] = []
    index = 0
    while index < len(lines):
        text = lines[index]
        if text.strip().startswith(">>>") or not call_start.search(text):
            index += 1
            continue
        start = call_start.search(text).start()  # prose before the call may hold quotes
        joined, used = text, 1  # a call whose brackets stay open goes on over the next lines
        while _open_brackets(joined[start:]) > 0 and used < MAX_CONTINUATION_LINES and index + used < len(lines):
            joined += "\n" + lines[index + used]
            used += 1
        _read_line(joined, first_line + index, names, call_start, here, alias, formulas)
        index += used
    for example in here.examples:
        if formulas and example.form == "=":
            here.skipped.append((example.line, f"{example.expression} = {example.expected!r}",
                                 f"the docstring defines the function by formulas with '=' (line {formulas[0]})"))
        else:
            found.examples.append(example)
    found.skipped += here.skipped


def _read_line(text: str, line: int, names: set[str], call_start: re.Pattern, found: DocExamples,
               alias: str | None = None, formulas: list[int] | None = None) -> None:
    position = 0
    while (match := call_start.search(text, position)) is not None:
        end = _closing_bracket(text, match.end() - 1)
        if end is None:
            return
        call, rest = text[match.start():end + 1], text[end + 1:]
        position = end + 1
        separator = _SEPARATOR.match(rest)
        if separator is None:
            continue  # a call in prose, not an example
        name = call[:call.index("(")].strip()
        if name not in names:  # `alias` is set: the prompt's one function under another name
            if hasattr(builtins, name) or keyword.iskeyword(name):
                continue
            call = alias + call[len(name):]
        shown = " ".join((call + rest).split())
        why = _call_problem(call, names, top_call=True)
        value_text = rest[separator.end():]
        length, value = (None, None) if why is not None else _value(value_text)
        if why is None and length is None:
            why = f"what follows {separator.group(1)!r} is not a Python literal"
        if why is not None:
            if separator.group(1) == "=" and formulas is not None:
                formulas.append(line)
            found.skipped.append((line, shown, why))
            continue
        found.examples.append(Example(ast.unparse(ast.parse(call, mode="eval")), value, line, separator.group(1)))
        position = end + 1 + separator.end() + length


def _value(text: str) -> tuple[int | None, object]:
    """(length, value) of the inline value at the start of `text`: a Python literal, `true` or
    `false`, or a worked value "19 - 5 - 6 = 8" whose arithmetic gives the literal after its
    last `=` (kept only then); (None, None) when there is none."""
    length = _literal_prefix(text)
    if length is not None:
        return length, _literal(text[:length])[1]
    word = re.match(r"(true|false)\b", text)
    if word and _TAIL.match(text, word.end()):
        return word.end(), _BOOLEANS[word.group(1)]
    worked = _WORKED.match(text)
    if worked and (length := _literal_prefix(text[worked.end():])) is not None:
        value = _literal(text[worked.end():worked.end() + length])[1]
        if _arithmetic(worked.group(1)) == value:
            return worked.end() + length, value
    return None, None


def _arithmetic(text: str) -> object:
    """The value of an arithmetic expression of number literals (+ - * / // % **, brackets),
    None when `text` is not one."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                 ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](value(node.left), value(node.right))
        raise ValueError("not arithmetic")

    try:
        return value(tree)
    except (ValueError, ZeroDivisionError, TypeError):
        return None


def _read_input_output(lines: list[str], first_line: int, entry: str, parameters: list[str], names: set[str],
                       found: DocExamples) -> None:
    """Examples written "Input: arguments" then "Output: value" (on the lines up to
    MAX_INPUT_LINES below): arguments as `name = value` or `name : value` items or bare values,
    separated by commas or lines (`_arguments`)."""
    for index, text in enumerate(lines):
        opened = _INPUT.match(text)
        if opened is None:
            continue
        given = [opened.group(1)]
        for after in lines[index + 1:index + 1 + MAX_INPUT_LINES]:
            output = _OUTPUT.match(after)
            if output is not None:
                _add_call(entry, parameters, "\n".join(given), output.group(1), first_line + index, "Input/Output",
                          names, found)
                break
            given.append(after)


def _read_for_should_be(lines: list[str], first_line: int, entry: str, parameters: list[str], names: set[str],
                        found: DocExamples) -> None:
    """Examples written "For lst = [1, 2] the output should be 5" ("the result should be"; prose
    may stand between the arguments and "the": "For N = 150, the sum of digits will be 6 the
    output should be "110".")."""
    for index, text in enumerate(lines):
        match = _FOR.search(text)
        if match is not None:
            _add_call(entry, parameters, match.group(1), match.group(2), first_line + index, "For/should be",
                      names, found, prose_after=True)


def _add_call(entry: str, parameters: list[str], arguments: str, output: str, line: int, form: str,
              names: set[str], found: DocExamples, prose_after: bool = False) -> None:
    """The example `entry(arguments) == output`, added to `found`, or skipped with the reason."""
    shown = " ".join(f"{arguments} -> {output}".split())
    values = _arguments(arguments, parameters, prose_after)
    length = _literal_prefix(output)
    if values is None:
        found.skipped.append((line, shown, f"its arguments are not {len(parameters)} Python literals "
                                           f"(for {', '.join(parameters)})"))
    elif length is None:
        found.skipped.append((line, shown, "its output is not a Python literal"))
    else:
        call = f"{entry}({', '.join(values)})"
        why = _call_problem(call, names, top_call=True)
        if why is None:
            found.examples.append(Example(ast.unparse(ast.parse(call, mode="eval")), _literal(output[:length])[1],
                                          line, form))
        else:
            found.skipped.append((line, shown, why))


def _arguments(text: str, parameters: list[str], prose_after: bool) -> list[str] | None:
    """The argument sources of `text` in the order of `parameters`: items `name = value` (or
    `name : value`) naming every parameter, or as many items (named or not) as there are
    parameters, in order; each value a Python literal. prose_after: text after the items is
    allowed (and ignored). None when the items do not fit."""
    items, position = [], 0
    while position < len(text):
        while position < len(text) and text[position] in " \t\n,":
            position += 1
        if position >= len(text):
            break
        named = _ARGUMENT.match(text, position)
        start = named.end() if named else position
        length = _literal_prefix(text[start:], tail=_WORD_END)
        if length is None:
            if prose_after and items:
                break
            return None
        value = text[start:start + length].strip()
        if value.endswith(",") and _literal(value[:-1])[0]:  # "[1, 2], k = 3": the comma separates
            value = value[:-1].rstrip()
        items.append((named.group(1) if named else None, value))
        position = start + length
    names = [name for name, _ in items]
    if sorted(name for name in names if name) == sorted(parameters) and None not in names:
        by_name = dict(items)
        return [by_name[name] for name in parameters]
    if len(items) == len(parameters) and items:
        return [value for _, value in items]
    return None


def _asserted(compare: ast.Compare, shown: object):
    """(call, expected, None, "==") of a doctest `call == literal` whose output is True or
    empty (an assertion written after `>>>`); (compare, None, why, "") otherwise."""
    if len(compare.ops) != 1 or not isinstance(compare.ops[0], ast.Eq) or shown not in (True, None):
        return compare, None, "it is a comparison that does not assert `call == value`", ""
    ok, value = _literal(ast.unparse(compare.comparators[0]))
    if not ok or not isinstance(compare.left, ast.Call):
        return compare, None, "it compares with something that is not a Python literal", ""
    return compare.left, value, None, "=="


def _call_problem(expression: str, names: set[str], top_call: bool) -> str | None:
    """Why `expression` is not an example's call (None when it is): it must parse, call one of
    `names` (be such a call, when `top_call`) and read no name but those and builtins."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError):
        return "the call does not parse"
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if top_call and not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id in names):
        return "it is not a call of a function the prompt defines"
    if not any(isinstance(node.func, ast.Name) and node.func.id in names for node in calls):
        return "it calls no function the prompt defines"
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "print":
        return "it prints instead of returning a value"
    bound = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {argument.arg for node in ast.walk(tree) if isinstance(node, ast.Lambda)
              for argument in ast.walk(node.args) if isinstance(argument, ast.arg)}  # comprehension, lambda
    unknown = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in names
                      and node.id not in bound and not hasattr(builtins, node.id)})
    if unknown:
        return f"it reads {', '.join(unknown)}, which the prompt does not define"
    return None


def _literal(text: str) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _literal_prefix(text: str, tail: re.Pattern = _TAIL) -> int | None:
    """Length of the longest prefix of `text` that is a Python literal followed by an end (see
    `_TAIL`, or `tail`), tried at each token end; None when there is none."""
    ends = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text.split("\n")[0] + "\n").readline):
            if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                break
            ends.append(token.end[1])
            if text[token.end[1] - 1] == "." and token.end[1] > 1:  # "16." may end a sentence
                ends.append(token.end[1] - 1)
    except (tokenize.TokenError, SyntaxError):
        pass
    for end in sorted(set(ends), reverse=True):
        if _literal(text[:end])[0] and tail.match(text, end):
            if text[end - 1] == "." and _literal(text[:end - 1])[0]:
                return end - 1  # "should return -15." ends a sentence: the number is -15
            return end
    return None


def _scan(text: str):
    """(index, character) of `text` outside quoted strings (a quote left open runs to the end)."""
    index, quote = 0, None
    while index < len(text):
        character = text[index]
        if quote is not None:
            if character == "\\":
                index += 1
            elif character == quote:
                quote = None
        elif character in "'\"":
            quote = character
        else:
            yield index, character
        index += 1


def _open_brackets(text: str) -> int:
    depth = 0
    for _, character in _scan(text):
        depth += (character in "([{") - (character in ")]}")
    return depth


def _closing_bracket(text: str, start: int) -> int | None:
    """Index of the bracket closing the one at `start`, None when it stays open."""
    depth = 0
    for index, character in _scan(text[start:]):
        depth += (character in "([{") - (character in ")]}")
        if depth == 0:
            return start + index
    return None
