"""Answer extraction and comparison for voting and exact-answer verification.

`extract_answer` takes the last match of a regex (default: a \\boxed{...} answer, else
"answer is X", else the last number in the text), or with `field` the value at a path in a JSON
output (`json_field`: self-consistency over a field of a structured output). `answers_match`
compares two answers as math with `math-verify` when asked (so "0.5", "1/2" and "\\frac{1}{2}" are one answer), else as
normalized strings.

Every regex here, the caller's `pattern` included, runs on RE2 (`compile_pattern`): matching
takes time linear in the text whatever the pattern (Python's backtracking `re` takes
exponential time on "(a+)+$" against a long run of a's, holding the interpreter meanwhile), so
backreferences and lookaround are refused. Math comparisons run in a worker process under a
deadline (`math_equal`): a comparison past `MATH_TIMEOUT_SECONDS` is a non-match.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

from metagen.scoring.math_equal import MATH_TIMEOUT_SECONDS, math_equal

if TYPE_CHECKING:
    from metagen.decoding.result import Completion

AnswerExtractor = Callable[[str], "str | None"]


def _nested(depth: int) -> str:
    """RE2 text matching balanced braces nested at most `depth` deep (RE2 has no recursion)."""
    return r"[^{}]*" if depth == 0 else r"(?:[^{}]|\{" + _nested(depth - 1) + r"\})*"


BOXED_DEPTH = 4  # \boxed{\frac{\sqrt{3}}{2}} nests 2 deep inside the box; MATH's answers at most 2
_DEFAULT_PATTERNS = (  # RE2 syntax: \pL \pN are Unicode letters and numbers (\d is 0-9 only)
    r"\\boxed\{(" + _nested(BOXED_DEPTH) + r")\}",
    r"answer is[:\s]*\$?([\pL\pN_\\{}/^.,+-]*[\pL\pN_}])",
    r"(-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?)",
)
_THOUSANDS = r"-?\d{1,3}(,\d{3})+(\.\d+)?"  # "1,234.5"
_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")


@lru_cache(maxsize=256)
def compile_pattern(pattern: str):
    """`pattern` compiled by RE2 (google-re2): matching is O(len(pattern) * len(text)) at
    worst, whatever the pattern, and releases the GIL. RE2 syntax is Python's minus
    backreferences and lookaround; \\d and \\w are ASCII (\\pL, \\pN: Unicode), $ is the end of the
    text only. ValueError naming `pattern` when RE2 refuses it (invalid syntax, a feature it
    lacks, or larger than its memory budget)."""
    import re2

    if not isinstance(pattern, str):
        raise ValueError(f"pattern={pattern!r} is not a regular expression: give a string")
    options = re2.Options()
    options.log_errors = False  # the ValueError says it
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        detail = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) \
            else str(error)
        if detail.startswith("invalid escape sequence: \\") and detail[-1:].isdigit() or "(?P=" in pattern:
            feature = "backreferences"
        elif any(detail.startswith(f"invalid perl operator: {token}") for token in _LOOKAROUND):
            feature = "lookaround"
        else:
            raise ValueError(f"pattern={pattern!r} is not a valid regular expression ({detail}; RE2 syntax)") from None
        raise ValueError(f"pattern={pattern!r} is refused ({detail}): answer patterns run on RE2, in time linear in "
                         f"the text, which has no {feature} (it needs backtracking, whose time can grow "
                         "exponentially with the text); capture the answer in a group instead") from None


def parse_field_path(path: str) -> tuple[str | int, ...]:
    """"a.b.0.c" -> ("a", "b", 0, "c"): keys separated by dots; an all-digit segment indexes a
    list (and is also tried as a key of an object). ValueError naming the path for an empty one
    or an empty segment."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"answer_field={path!r} is not a field path: give keys separated by dots, e.g. 'answer' "
                         "or 'result.items.0'")
    segments = path.split(".")
    if any(not segment for segment in segments):
        raise ValueError(f"answer_field={path!r} has an empty segment: keys are separated by single dots")
    return tuple(int(s) if s.isdigit() else s for s in segments)


def check_answer_field(pattern: str | None, answer_field: str | None) -> None:
    """ValueError naming the field when pattern is no RE2 regex (`compile_pattern`), when both
    are given, or when answer_field is no path."""
    if pattern is not None:
        compile_pattern(pattern)
    if answer_field is None:
        return
    if pattern is not None:
        raise ValueError(f"pattern={pattern!r} and answer_field={answer_field!r} both say where the answer is: "
                         "give one")
    parse_field_path(answer_field)


def json_field(text: str, path: str) -> str | None:
    """The value at `path` (see `parse_field_path`) in the JSON document `text`, as a string:
    a JSON string as it is, any other value as compact JSON with sorted keys (so 3 and 3.0 stay
    distinct, and equal objects are one answer). None when `text` is not JSON or the path is not
    there, or when it nests deeper than the interpreter's recursion limit (json's parser
    recurses). O(len(text))."""
    segments = parse_field_path(path)
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError):
        return None
    for segment in segments:
        if isinstance(value, dict) and str(segment) in value:
            value = value[str(segment)]
        elif isinstance(value, list) and isinstance(segment, int) and segment < len(value):
            value = value[segment]
        else:
            return None
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except RecursionError:
        return None


def extract_answer(text: str, pattern: str | None = None, field: str | None = None) -> str | None:
    """The answer in `text`: with `field`, the value at that path of the JSON output
    (`json_field`); else the last match of `pattern` (group 1 if it has one), or with no
    pattern the first of the default patterns that matches. None when nothing matches.
    O(len(text)) per pattern (RE2, `compile_pattern`)."""
    if field is not None:
        if pattern is not None:
            raise ValueError(f"pattern={pattern!r} and answer_field={field!r} both say where the answer is: give one")
        return json_field(text, field)
    patterns = (pattern,) if pattern is not None else _DEFAULT_PATTERNS
    for candidate in patterns:
        compiled = compile_pattern(candidate)
        match = None
        for match in compiled.finditer(text):  # the last one
            pass
        if match is not None:
            found = (match.group(1) if compiled.groups else match.group(0)).strip()
            if compile_pattern(_THOUSANDS).fullmatch(found):  # thousands separators
                found = found.replace(",", "")
            return found
    return None


def answer_reader(pattern: str | None = None,
                  extractor: AnswerExtractor | None = None) -> Callable[[Completion], str | None]:
    """candidate -> its answer: the candidate's `answer` when a strategy has set it, else the one
    `extractor` finds in its text, or `extract_answer` with `pattern` (default extraction when
    None). ValueError when both are given, or when RE2 refuses `pattern` (now, not at the first
    candidate)."""
    if pattern is not None and extractor is not None:
        raise ValueError("give pattern or extractor, not both")
    if pattern is not None:
        compile_pattern(pattern)
    extract = extractor or (lambda text: extract_answer(text, pattern))

    def read(candidate: Completion) -> str | None:
        return candidate.answer if candidate.answer is not None else extract(candidate.text)

    return read


def normalize(answer: str) -> str:
    """Lower-case, whitespace collapsed, surrounding $ and trailing period dropped."""
    return " ".join(answer.strip().strip("$").rstrip(".").lower().split())


def answers_match(a: str | None, b: str | None, math: bool = False) -> bool:
    """Whether two answers are the same: normalized strings, or equal as math (math-verify)."""
    if a is None or b is None:
        return False
    if normalize(a) == normalize(b):
        return True
    if not math:
        return False
    return _math_equal(a, b)


@lru_cache(maxsize=65536)
def _math_equal(a: str, b: str) -> bool:
    """Equality as math (cached: voting compares the same answers many times), in math-verify's
    worker process within MATH_TIMEOUT_SECONDS (`math_equal`; past it: False)."""
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:  # optional extra
        from metagen.extras import core_requirement

        raise ImportError("math answer comparison needs math-verify, a dependency of metagen that is not "
                          f"installed here: {core_requirement('math-verify')}")
    return math_equal(a, b, MATH_TIMEOUT_SECONDS)
