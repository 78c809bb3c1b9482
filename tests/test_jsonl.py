"""metagen.jsonl: records with the line numbers an editor shows, gzip, and every error named by
file and line."""

from __future__ import annotations

import gzip

import pytest

from metagen.jsonl import appended_lines, json_records, text_lines


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


def test_appended_lines_cut_a_torn_last_line_off_the_file(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": ')
    assert list(appended_lines(path)) == [(1, '{"a": 1}'), (3, '{"b": 2}')]
    assert path.read_bytes() == b'{"a": 1}\n\n{"b": 2}\n'  # the next append starts a whole line
    path.write_bytes(b'{"a": 1}\n\xff\n')
    with pytest.raises(ValueError, match=f"{path}:2: not UTF-8 text"):
        list(appended_lines(path))
    with pytest.raises(ValueError, match="cannot be read"):
        list(appended_lines(tmp_path))
