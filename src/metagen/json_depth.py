"""How deeply a JSON text nests, measured before it is decoded.

Python's `json` decoder, and most code that walks a decoded value, recurse once per level of
nesting, so a text such as `[[[...]]]` 100,000 deep raises RecursionError (or worse, in code with
a deeper stack). `json_depth` measures the nesting without recursion, so a caller can refuse a
text deeper than `MAX_JSON_DEPTH` before anything recursive touches it (serde_json's default
recursion limit is also 128).

    depth(text) = max over prefixes of (#'[' + #'{' − #']' − #'}'), brackets inside strings skipped

`check_json_depth` first counts the openers: a text with at most `limit` of them cannot nest
deeper (the usual request, O(L) in C, microseconds). Otherwise a regex removes the strings,
`bytes.translate` keeps the brackets and numpy takes the running depth: O(L) with no Python loop
per character (a 1 MiB body of many small strings, the slowest case, takes tens of milliseconds).
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 128  # arrays and objects inside one another; a JSON Schema 60 levels deep fits

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # openers +1, closers -1 (as int8)
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (0 for a scalar). `text` need not be
    valid JSON (an unterminated string's brackets count); for valid JSON the result is exact."""
    outside = _STRING.sub("", text).encode("utf-8", "surrogatepass")  # no byte of a multibyte character is ASCII
    brackets = outside.translate(_STEPS, _NOT_BRACKETS)
    if not brackets:
        return 0
    import numpy as np  # a core dependency, imported on use: importing metagen stays light

    steps = np.frombuffer(brackets, dtype=np.int8)  # (K,) one per bracket outside strings
    return max(0, int(np.cumsum(steps, dtype=np.int64).max()))


def check_json_depth(text: str, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """ValueError naming `what` when `text` nests arrays and objects deeper than `limit`."""
    if text.count("[") + text.count("{") <= limit:
        return
    depth = json_depth(text)
    if depth > limit:
        raise ValueError(f"{what} nests arrays and objects {depth} deep, more than the limit of {limit}")
