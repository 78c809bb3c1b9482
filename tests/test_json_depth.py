"""json_depth: the nesting of arrays and objects, measured without recursion and without decoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metagen.json_depth import MAX_JSON_DEPTH, check_json_depth, json_depth


@pytest.mark.parametrize("text, depth", [
    ("", 0), ("1", 0), ('"[{"', 0), ("[]", 1), ("{}", 1), ("[[1], [2, [3]]]", 3),
    ('{"a": {"b": [{}]}}', 4),
    ('{"a": "[[[["}', 1),  # brackets inside a string do not count
    ('["x\\"[[", [0]]', 2),  # nor after an escaped quote
    ('["x\\\\", [[0]]]', 3),  # an escaped backslash ends before the quote, which closes the string
    ('{"\u540d\ud800": [[]]}', 3),  # any character in a key
    ("]]]", 0),
    ("[" * 100_000 + "]" * 100_000, 100_000),
])
def test_depth_by_hand(text, depth):
    assert json_depth(text) == depth


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


_TEXT = st.text(alphabet=st.sampled_from('ab"\\[]{}/\u00e9\u540d'), max_size=6)
_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                       max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.booleans())
def test_depth_equals_the_decoded_values_depth(value, ascii_only):
    assert json_depth(json.dumps(value, ensure_ascii=ascii_only)) == _depth(value)


def test_check_names_the_text_and_the_limit():
    check_json_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x")  # at the limit: accepted
    check_json_depth("[]" * 10_000, "x")  # many openers, shallow
    with pytest.raises(ValueError, match=r"^the body nests arrays and objects 129 deep, more than the limit of 128$"):
        check_json_depth("[" * 129 + "]" * 129, "the body")
