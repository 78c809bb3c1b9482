"""metagen.jsonl: records with the line numbers an editor shows, gzip, and every error named by
file and line."""

from __future__ import annotations

import gzip

import pytest

from metagen.jsonl import json_records, text_lines


def test_records_keep_the_line_numbers_of_the_file_blank_lines_counted(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"x": 1}\n\n   \n{"x": 2}\r\n')
    assert list(json_records(path)) == [(1, {"x": 1}), (4, {"x": 2})]
    packed = tmp_path / "a.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert list(json_records(packed)) == [(1, {"x": 1}), (4, {"x": 2})]


@pytest.mark.parametrize(("content", "message"), [
    (b'{"x": 1}\n{"x": \n', "a.jsonl:2: not valid JSON (Expecting value)"),
    (b'{"x": 1}\n[1, 2]\n', "a.jsonl:2: expected a JSON object, got list"),
    (b'"text"\n', "a.jsonl:1: expected a JSON object, got str"),
    (b'{"x": 1}\n{"x": "\xff"}\n', "a.jsonl:2: not UTF-8 text (byte 0xff at column 8)"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, content, message):
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        list(json_records(path))
    assert message in str(error.value)


def test_a_missing_file_a_directory_and_a_truncated_gzip_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file"):
        list(text_lines(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="is a directory, not a JSONL file"):
        list(text_lines(tmp_path))
    packed = tmp_path / "cut.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"x": 1}\n' * 100)[:20])
    with pytest.raises(ValueError, match="cut.jsonl.gz: not a whole gzip file"):
        list(text_lines(packed))
