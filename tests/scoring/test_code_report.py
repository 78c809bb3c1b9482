"""Reading the harness's records in the caller: values round-trip through the harness's encoding
as plain Python values; anything else, whatever its bytes, is a problem, never an exception."""

import json
import random

import pytest

from metagen.scoring.code_harness import encode
from metagen.scoring.code_report import decode, read_report


def round_trip(value):
    return decode(json.loads(json.dumps(encode(value, [10_000]))))


def test_values_round_trip_with_their_types():
    values = [None, True, 0, -2**70, 1.5, float("inf"), "é\x00", b"\x00\xff", 1 - 2j, [1, [2]], (1, (2,)),
              {1, "a"}, frozenset({(1, 2)}), {"a": [1], 2: (3,), (4, 5): None}, [], (), {}]
    for value in values:
        back = round_trip(value)
        assert back == value and type(back) is type(value)
    assert type(round_trip(bytearray(b"x"))) is bytes


def test_subclasses_are_reported_as_their_base_type_and_other_objects_are_refused():
    class Loud(int):
        def __eq__(self, other):
            return True

    class Listy(list):
        def __iter__(self):
            return iter([99])

    assert type(round_trip(Loud(3))) is int and round_trip(Loud(3)) == 3
    assert round_trip(Listy([1, 2])) == [1, 2]  # the list's own items, not its __iter__
    with pytest.raises(TypeError, match="type object cannot be reported"):
        encode(object(), [100])
    with pytest.raises(ValueError, match="too large"):
        encode("x" * 101, [100])
    nested = []
    for _ in range(70):
        nested = [nested]
    with pytest.raises(ValueError, match="nested deeper"):
        encode(nested, [1000])


def record(**fields) -> str:
    return json.dumps(fields) + "\n"


def test_a_good_report_and_a_line_cut_off_at_the_end():
    stdout = (record(stage="program", compiles=True, error=None) + record(check=0, value={"tuple": [1, 2]})
              + record(test=1, error="Traceback ...") + '{"check": 1, "val')
    report = read_report(stdout, tests=2, checks=2)
    assert report.problem is None and report.program["compiles"]
    assert report.values == {0: (1, 2)} and report.errors == {1: "Traceback ..."}


@pytest.mark.parametrize("line, problem", [
    ("not json\n", "is not JSON"),
    ("[1, 2]\n", "is not a record"),
    (record(test=0, error=None), "is not a known record"),
    (record(check=0, passed=True), "is not a known record"),
    (record(check=5, value=1), "names a check or test that does not exist"),
    (record(check=True, value=1), "names a check or test that does not exist"),
    (record(check=0, value={"tuple": [1], "list": []}), "holds a malformed value"),
    (record(check=0, value={"set": [[1]]}), "holds a malformed value"),
    (record(check=0, value={"dict": [[[1], 2]]}), "holds a malformed value"),
    (record(check=0, value={"bytes": "zz"}), "holds a malformed value"),
    (record(check=0, value=1) + record(check=0, value=1), "line 2 of its report repeats a check"),
    (record(stage="program", compiles=True, error=None) * 2, "repeats the program's record"),
    ("[" * 100_000 + "\n", "is not JSON"),
])
def test_every_malformed_record_is_a_problem(line, problem):
    report = read_report(line, tests=1, checks=2)
    assert problem in report.problem


def test_random_bytes_never_raise():
    generator = random.Random(0)
    pieces = ['{"check": 0, "value": ', '{"test": 0, "error": "x"}', '{"dict": [[', "]", "}", '"', "1", "\n",
              '{"set": [', '{"stage": "program", "compiles": true, "error": null}', "NaN", ",", "\x00"]
    for _ in range(2000):
        stdout = "".join(generator.choice(pieces) for _ in range(generator.randrange(1, 12)))
        report = read_report(stdout, tests=1, checks=1)
        assert report.problem is None or report.problem.startswith("line ")
