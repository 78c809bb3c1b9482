"""A local corpus: read once, fingerprinted, its index cached on disk until the corpus changes.

    passages = read_corpus("wiki.jsonl")      # one {"id", "text", "title"?} object a line
    passages = read_corpus("notes/")          # every *.txt below, split into paragraphs on blank lines
    entry, built = cached_index("bm25", "wiki.jsonl", settings, build)

A directory's passages are its .txt files in sorted path order, each split on blank lines;
a paragraph's id is "<relative path>#<k>" (k from 0), its title the file's stem.

The index lives in `$METAGEN_CACHE/retrieval/<kind>-<fingerprint>/`, an entry of the crash-safe
disk cache (`models/disk_cache.py`: built in a staging directory under a lock, renamed into place,
verified against its manifest before use). The fingerprint is the SHA-256 of the index's kind and
settings and, for every corpus file, its relative path, size, mtime and content hash:

    fingerprint = sha256(json([kind, settings, [(path, size, mtime_ns, sha256(bytes)), ...]]))

so an edited, added or removed file gives another entry (the corpus is re-indexed), and a
touched file whose bytes are the same does too (mtime is part of it; cheap to rebuild, and the
check stays O(1) stats plus one read). Reading and hashing are O(corpus bytes) per load.
Entries of older versions of a corpus are left in the cache (delete the directory to reclaim).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

from metagen.jsonl import json_records
from metagen.models.disk_cache import (EntryLock, cache_directory, cache_hit, manifest_problem, publish_entry,
                                       staging_directory)
from metagen.retrieval.base import Passage

LOCK_WAIT_SECONDS = 600.0  # another process indexing the same corpus is waited for this long
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def corpus_files(path: str | Path) -> list[Path]:
    """The corpus's files: a JSONL file itself, or a directory's *.txt files (recursively, sorted);
    ValueError naming the path when it is neither, or a directory holds no .txt file."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(item for item in path.rglob("*.txt") if item.is_file())
        if not files:
            raise ValueError(f"corpus {str(path)!r} is a directory without .txt files")
        return files
    raise ValueError(f"corpus {str(path)!r} does not exist: give a .jsonl file or a directory of .txt files")


def read_corpus(path: str | Path) -> list[Passage]:
    """The passages of a JSONL file or a directory of .txt files (see the module), score 0.
    ValueError naming the file, line and field for a malformed record or a repeated id."""
    path = Path(path)
    passages = (_read_jsonl(path) if path.is_file()
                else [passage for file in corpus_files(path) for passage in _read_text(path, file)])
    seen: set[str] = set()
    for passage in passages:
        if passage.id in seen:
            raise ValueError(f"corpus {str(path)!r}: id {passage.id!r} appears twice")
        seen.add(passage.id)
    if not passages:
        raise ValueError(f"corpus {str(path)!r} holds no passages")
    return passages


def _read_jsonl(path: Path) -> list[Passage]:
    passages = []
    for number, record in json_records(path):
        where = f"{path}:{number}"
        for name, required in (("id", True), ("text", True), ("title", False)):
            value = record.get(name)
            wrong = isinstance(value, bool) or not isinstance(value, (str, int) if name == "id" else str)
            if (required or value is not None) and wrong:
                kind = "a string or an int" if name == "id" else "a string"
                raise ValueError(f"{where}: field {name!r} must be {kind}, got {value!r}")
        passages.append(Passage(str(record["id"]), record["text"], 0.0, record.get("title")))
    return passages


def _read_text(root: Path, file: Path) -> list[Passage]:
    name = file.relative_to(root).as_posix()
    text = file.read_text(encoding="utf-8").replace("\r\n", "\n")
    paragraphs = [" ".join(block.split()) for block in _PARAGRAPH_BREAK.split(text)]
    return [Passage(f"{name}#{k}", paragraph, 0.0, file.stem)
            for k, paragraph in enumerate(p for p in paragraphs if p)]


def fingerprint(kind: str, path: str | Path, settings: dict) -> str:
    """24 hex digits identifying (kind, settings, the corpus files' paths, sizes, mtimes and bytes)."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    files = []
    for file in corpus_files(path):
        stat = file.stat()
        content = hashlib.sha256()
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 22):
                content.update(chunk)
        files.append([file.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns, content.hexdigest()])
    text = json.dumps([kind, settings, files], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_index(kind: str, path: str | Path, settings: dict, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """(entry directory, built): the cached index of the corpus at `path` for `kind` and `settings`,
    `build(directory)` writing it there first when no valid entry exists (built = True)."""
    entry = cache_directory() / "retrieval" / f"{kind}-{fingerprint(kind, path, settings)}"
    if cache_hit(entry):
        return entry, False
    lock = EntryLock(entry)
    try:
        if not lock.acquire(LOCK_WAIT_SECONDS, f"indexing {path}"):
            raise TimeoutError(f"the index {entry} stayed locked by another process for {LOCK_WAIT_SECONDS:g} s")
        if manifest_problem(entry) is None:  # another process built it meanwhile
            return entry, False
        with staging_directory(entry) as staging:
            build(staging)
            publish_entry(staging, entry, kind=kind, corpus=str(Path(path).resolve()))
    finally:
        lock.close()
    return entry, True
