"""Answer extraction and comparison for voting and exact-answer verification.

`extract_answer` takes the last match of a regex (default: a \\boxed{...} answer, else
"answer is X", else the last number in the text), or with `field` the value at a path in a JSON
output (`json_field`: self-consistency over a field of a structured output). `answers_match`
compares two answers as math with `math-verify` when asked (so "0.5", "1/2" and "\\frac{1}{2}" are one answer), else as
normalized strings. math-verify bounds each parse and comparison with a timeout built on
signal.alarm, which only the main thread may set: on any other thread (concurrent evaluation)
they run without one.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from functools import lru_cache

AnswerExtractor = Callable[[str], "str | None"]

_DEFAULT_PATTERNS = (
    r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}",
    r"answer is[:\s]*\$?([\w\\{}/^.,+-]*[\w}])",
    r"(-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?)",
)


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
    """ValueError naming the fields when both are given, or when answer_field is no path."""
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
    there. O(len(text))."""
    segments = parse_field_path(path)
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    for segment in segments:
        if isinstance(value, dict) and str(segment) in value:
            value = value[str(segment)]
        elif isinstance(value, list) and isinstance(segment, int) and segment < len(value):
            value = value[segment]
        else:
            return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def extract_answer(text: str, pattern: str | None = None, field: str | None = None) -> str | None:
    """The answer in `text`: with `field`, the value at that path of the JSON output
    (`json_field`); else the last match of `pattern` (group 1 if it has one), or with no
    pattern the first of the default patterns that matches. None when nothing matches."""
    if field is not None:
        if pattern is not None:
            raise ValueError(f"pattern={pattern!r} and answer_field={field!r} both say where the answer is: give one")
        return json_field(text, field)
    patterns = (pattern,) if pattern is not None else _DEFAULT_PATTERNS
    for candidate in patterns:
        matches = list(re.finditer(candidate, text))
        if matches:
            match = matches[-1]
            found = (match.group(1) if match.groups() else match.group(0)).strip()
            if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", found):  # thousands separators
                found = found.replace(",", "")
            return found
    return None


def normalize(answer: str) -> str:
    """Lower-case, whitespace collapsed, surrounding $ and trailing period dropped."""
    return " ".join(answer.strip().strip("$").rstrip(".").lower().split())


def _timeout() -> int | None:
    """math-verify's timeout in seconds: 5 on the main thread, None (none) elsewhere, since its
    timeout is a signal.alarm, which raises ValueError off the main thread."""
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parsed(answer: str):
    from math_verify import parse

    return parse(answer if "$" in answer or "\\" in answer else f"${answer}$", parsing_timeout=_timeout())


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
    """Equality as math (cached: voting compares the same answers many times)."""
    try:
        from math_verify import verify
    except ImportError as error:  # optional extra
        raise ImportError("math answer comparison needs math-verify: pip install 'metagen[math]'") from error
    parsed_a, parsed_b = _parsed(a), _parsed(b)
    return bool(parsed_a) and bool(parsed_b) and bool(verify(parsed_a, parsed_b, timeout_seconds=_timeout()))
