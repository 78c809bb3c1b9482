"""Reading JSONL files with line numbers: the one reader of evaluation problems, published task
files, retrieval corpora and question sets.

    for number, record in json_records(path):     # (line number from 1, JSON object)
        ...                                         # errors name f"{path}:{number}"

A file whose name ends in .gz is gunzipped first. Blank lines are skipped (their numbers are
still counted, so a message points at the line an editor shows). Every error names the file,
and the line when there is one: a missing file (FileNotFoundError), a directory, an unreadable
or truncated gzip file, a line that is not UTF-8, not JSON, or not a JSON object (ValueError).
Time and memory O(file bytes): the file is read whole, then split.

`appended_lines(path)` reads a file that a run appends to line by line (stored results, cached
sandbox runs): a torn last line, left by a writer killed mid-write, is cut off the file so that
the next append starts a whole line, and the lines before it are read as above.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file (gunzipped when its name ends in .gz); errors name
    the file (and line)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSONL file")
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    except (EOFError, zlib.error) as error:
        raise ValueError(f"{path}: not a whole gzip file ({error})") from None
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {line[error.start]:#04x} at column "
                             f"{error.start + 1}); save the file as UTF-8") from None


def appended_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank whole line of an append-only file; a torn last line
    (no newline: the writer was killed mid-write) is truncated away first, so it is written again
    rather than read. Errors name the file (and line)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    keep = raw[: raw.rfind(b"\n") + 1]
    if len(keep) != len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(len(keep))
    for number, line in enumerate(keep.splitlines(), start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {line[error.start]:#04x} at column "
                             f"{error.start + 1})") from None
        if text.strip():
            yield number, text


def json_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-blank line of `path`; ValueError naming the file
    and line of one that is not JSON or not an object."""
    for number, line in text_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record
