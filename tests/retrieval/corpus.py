"""A small corpus for the retrieval tests: records written as JSONL under tmp_path, with the index
cache (METAGEN_CACHE) kept there too so no test reads another's index."""

from __future__ import annotations

import json


def write_corpus(tmp_path, monkeypatch, records: list[dict]):
    """The path of a JSONL file holding `records`, one per line; METAGEN_CACHE set to tmp_path/cache."""
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path
