"""Reading the records `code_harness` writes, in the caller, trusting none of them.

Every line of the sandbox's stdout must be one well-formed record (the harness's format); a value
is rebuilt as a plain Python value (`decode`), so nothing the program made survives the trip. A
line that is not JSON, a record of an unknown shape, an index out of range or a second record
for the same check, test or stage make the whole report unusable (`Report.problem`): only the
program can have written it. A last line without its newline was cut off (the run was stopped
mid-write) and is dropped, like any record that never arrived: a check without a record fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MAX_DEPTH = 64  # as in code_harness
CONTAINERS = {"tuple": tuple, "set": set, "frozenset": frozenset}


@dataclass
class Report:
    """program: the "program" stage record ({"compiles", "error"}), or None if none arrived;
    values: check index -> reported value; errors: test index -> the error that stopped it;
    problem: why the report cannot be used, or None."""

    program: dict | None = None
    values: dict[int, object] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    problem: str | None = None


def decode(data, depth: int = 0):
    """The plain value that `code_harness.encode` turned into `data`; ValueError if `data` is not
    such an encoding (or is nested deeper than MAX_DEPTH)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item, depth + 1) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"{type(data).__name__} is not an encoded value")
    (kind, payload), = data.items()
    if kind in CONTAINERS and type(payload) is list:
        try:
            return CONTAINERS[kind](decode(item, depth + 1) for item in payload)
        except TypeError as error:  # an unhashable set member
            raise ValueError(str(error)) from None
    if kind == "dict" and type(payload) is list and all(type(pair) is list and len(pair) == 2 for pair in payload):
        try:
            return {decode(key, depth + 1): decode(value, depth + 1) for key, value in payload}
        except TypeError as error:  # an unhashable key
            raise ValueError(str(error)) from None
    if kind == "bytes" and type(payload) is str:
        return bytes.fromhex(payload)
    if kind == "complex" and type(payload) is list and len(payload) == 2 and all(type(x) is float for x in payload):
        return complex(*payload)
    raise ValueError(f"unknown encoding {kind!r}")


def read_report(stdout: str, tests: int, checks: int) -> Report:
    """The records in `stdout` for `tests` tests and `checks` checks (see the module docstring)."""
    report = Report()
    lines = stdout.split("\n")[:-1]  # the last piece has no newline: empty, or cut off
    for number, line in enumerate(lines, 1):
        problem = _take(report, line, tests, checks)
        if problem is not None:
            shown = line if len(line) <= 200 else line[:200] + "..."
            report.problem = f"line {number} of its report {problem}: {shown!r}"
            break
    return report


def _take(report: Report, line: str, tests: int, checks: int) -> str | None:
    """Add the record on `line` to `report`; what is wrong with it, or None."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return "is not JSON"
    if type(record) is not dict:
        return "is not a record"
    keys = set(record)
    index = record.get("check", record.get("test"))
    if keys in ({"check", "value"}, {"test", "error"}) and (type(index) is not int or not 0 <= index < (checks if "check" in keys else tests)):
        return "names a check or test that does not exist"
    if keys == {"check", "value"}:
        if index in report.values:
            return "repeats a check"
        try:
            report.values[index] = decode(record["value"])
        except (ValueError, RecursionError) as error:
            return f"holds a malformed value ({error})"
    elif keys == {"test", "error"} and type(record["error"]) is str:
        if index in report.errors:
            return "repeats a test"
        report.errors[index] = record["error"]
    elif keys == {"stage", "compiles", "error"} and record["stage"] == "program" and type(record["compiles"]) is bool \
            and (record["error"] is None or type(record["error"]) is str):
        if report.program is not None:
            return "repeats the program's record"
        report.program = record
    else:
        return "is not a known record"
    return None
