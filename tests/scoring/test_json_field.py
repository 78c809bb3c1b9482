"""json_field / extract_answer(field=...): the answer at a path of a JSON output, exactly."""

import pytest

from metagen.scoring.answers import check_answer_field, extract_answer, json_field, parse_field_path

DOC = '{"answer": "Paris", "n": 3, "x": 3.0, "ok": true, "none": null, "items": [{"v": 1}, {"v": [2, 3]}], ' \
      '"obj": {"b": 1, "a": 2}, "0": "zero-key"}'


@pytest.mark.parametrize(("path", "value"), [
    ("answer", "Paris"),  # strings as they are
    ("n", "3"), ("x", "3.0"),  # numbers as JSON: 3 and 3.0 stay distinct
    ("ok", "true"), ("none", "null"),
    ("items.0.v", "1"), ("items.1.v.1", "3"),  # digit segments index lists
    ("obj", '{"a":2,"b":1}'),  # objects compact with sorted keys: equal objects are one answer
    ("0", "zero-key"),  # a digit segment is a key of an object
])
def test_values_at_paths(path, value):
    assert json_field(DOC, path) == value
    assert extract_answer(DOC, field=path) == value


@pytest.mark.parametrize(("text", "path"), [
    (DOC, "missing"), (DOC, "answer.deeper"), (DOC, "items.2"), (DOC, "items.v"),
    ('{"answer": "Par', "answer"),  # cut JSON (a constrained output stopped by max_tokens)
    ("The answer is 4", "answer"), ("", "answer"),
])
def test_no_answer_when_the_text_or_path_does_not_hold_one(text, path):
    assert json_field(text, path) is None


def test_bad_paths_and_two_sources_are_refused_by_name():
    assert parse_field_path("a.1.b") == ("a", 1, "b")
    with pytest.raises(ValueError, match="answer_field='' is not a field path"):
        parse_field_path("")
    with pytest.raises(ValueError, match="answer_field='a..b' has an empty segment"):
        json_field(DOC, "a..b")
    with pytest.raises(ValueError, match="pattern='x' and answer_field='a' both say where the answer is"):
        check_answer_field("x", "a")
    with pytest.raises(ValueError, match="both say where the answer is"):
        extract_answer(DOC, "x", "answer")


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,  # deeper than the interpreter's recursion limit
    '{"answer": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"answer": ' + "[" * 100_000,  # and cut
])
def test_deeply_nested_json_is_no_answer_not_a_recursion_error(text):
    assert json_field(text, "answer") is None
    assert extract_answer(text, field="answer") is None

