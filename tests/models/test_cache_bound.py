"""The on-disk cache's bound: least recently used entries evicted down to METAGEN_CACHE_LIMIT
after each new entry, entries in use or just used kept, and `metagen cache` list / prune / clear."""

import json
import os
import time

import pytest

from metagen.cli import main
from metagen.models.disk_cache import (EntryLock, cache_entries, cache_limit, mark_used, prune, publish,
                                       publish_entry, remove_entry, staging_directory)


def make_entry(path, size, age_seconds=0.0, **facts):
    """A completed entry of one `size`-byte file, last used `age_seconds` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with staging_directory(path) as staging:
        (staging / "weights.bin").write_bytes(b"x" * size)
        publish(staging, path, **facts)
    stamp = time.time() - age_seconds
    os.utime(path / "manifest.json", (stamp, stamp))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path))
    monkeypatch.delenv("METAGEN_CACHE_LIMIT", raising=False)
    return tmp_path


def names(entries):
    return [entry.path.name for entry in entries]


def test_entries_are_listed_least_recently_used_first_with_kind_and_size(cache):
    make_entry(cache / "b", 1000, 100, source="/models/b.gguf")
    make_entry(cache / "kernels" / "k", 500, 300, module="fused")
    make_entry(cache / "retrieval" / "bm25-x", 200, 200, corpus="/data/c.jsonl")
    (cache / "data").mkdir()  # downloads are not entries
    (cache / "data" / "gsm8k.jsonl").write_text("{}\n")
    entries = cache_entries()
    assert names(entries) == ["k", "bm25-x", "b"]
    assert [entry.kind for entry in entries] == ["kernels", "retrieval", "weights"]
    assert [entry.source for entry in entries] == ["fused", "/data/c.jsonl", "/models/b.gguf"]
    manifest = (cache / "b" / "manifest.json").stat().st_size
    assert entries[2].size == 1000 + manifest


def test_prune_evicts_the_least_recently_used_down_to_the_limit(cache):
    for name, age in (("old", 300), ("mid", 200), ("new", 100)):
        make_entry(cache / name, 1000, age)
    one = cache_entries()[0].size
    assert names(prune(2 * one, idle_seconds=0)) == ["old"]
    assert names(cache_entries()) == ["mid", "new"]
    assert not (cache / "old").exists() and not list(cache.glob("old.staging-*"))
    assert names(prune(one, idle_seconds=0)) == ["mid"]
    assert names(prune(one, idle_seconds=0)) == []  # at the limit: nothing more
    assert prune(0, idle_seconds=0) == []  # 0: no bound


def test_kept_recently_used_and_locked_entries_are_not_evicted(cache):
    for name, age in (("a", 4000), ("b", 3000), ("c", 2000), ("d", 10)):
        make_entry(cache / name, 1000, age)
    with EntryLock(cache / "b") as lock:  # another writer (or remover) holds b
        assert lock.acquire(1.0, "test")
        assert not remove_entry(cache / "b")
        removed = prune(1, keep=(cache / "a",), idle_seconds=600)
    assert names(removed) == ["c"]  # a kept, b locked, d used 10 s ago
    assert names(cache_entries()) == ["a", "b", "d"]


def test_a_hit_marks_its_entry_used(cache):
    make_entry(cache / "a", 1000, 300)
    make_entry(cache / "b", 1000, 200)
    mark_used(cache / "a")
    mark_used(cache / "missing")  # nothing to mark: no error
    assert names(cache_entries()) == ["b", "a"]
    assert names(prune(1500, idle_seconds=0)) == ["b"]


def test_publish_entry_prunes_to_the_configured_limit_and_keeps_the_new_entry(cache, monkeypatch):
    make_entry(cache / "old1", 3000, 5000)
    make_entry(cache / "old2", 3000, 4000)
    monkeypatch.setenv("METAGEN_CACHE_LIMIT", "4kB")
    with staging_directory(cache / "new") as staging:
        (staging / "weights.bin").write_bytes(b"y" * 5000)  # alone above the limit: still kept
        publish_entry(staging, cache / "new")
    assert names(cache_entries()) == ["new"]


def test_a_bad_limit_is_named_and_loses_no_entry(cache, monkeypatch, capsys):
    monkeypatch.setenv("METAGEN_CACHE_LIMIT", "lots")
    with pytest.raises(ValueError, match="METAGEN_CACHE_LIMIT 'lots' is not a size"):
        cache_limit()
    with staging_directory(cache / "new") as staging:
        (staging / "weights.bin").write_bytes(b"y" * 10)
        publish_entry(staging, cache / "new")
    assert names(cache_entries()) == ["new"]
    assert "was not pruned: METAGEN_CACHE_LIMIT 'lots' is not a size" in capsys.readouterr().err


def test_leftover_staging_of_a_killed_writer_goes_once_idle(cache):
    leftover = cache / "a.staging-0123abcd"
    leftover.mkdir()
    (leftover / "part").write_bytes(b"z" * 10)
    prune(10**9, idle_seconds=600)
    assert leftover.exists()  # recent: its writer may still be at work
    os.utime(leftover, (time.time() - 700, time.time() - 700))
    prune(10**9, idle_seconds=600)
    assert not leftover.exists()


def test_cli_lists_prunes_and_clears(cache, capsys):
    make_entry(cache / "w1", 1000, 300, source="/models/one.gguf", dtype="auto")
    make_entry(cache / "w2", 1000, 200, source="/models/two.gguf", dtype="int4")
    make_entry(cache / "retrieval" / "dense-y", 100, 100, corpus="/data/c.jsonl")
    assert main(["cache", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [row["source"] for row in listing["entries"]] == ["/models/one.gguf", "/models/two.gguf", "/data/c.jsonl"]
    assert listing["limit"] == 20 * 10**9 and listing["size"] == sum(row["size"] for row in listing["entries"])
    assert main(["cache"]) == 0
    assert "3 entries" in capsys.readouterr().out
    assert main(["cache", "prune", "--limit", "1kB"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out  # w1 then w2: both older than the index
    assert names(cache_entries()) == ["dense-y"]
    assert main(["cache", "prune", "--limit", "0"]) == 2
    assert "--limit '0'" in capsys.readouterr().err
    make_entry(cache / "w3", 10, 0)
    assert main(["cache", "clear", "--kind", "retrieval"]) == 0
    assert names(cache_entries()) == ["w3"]
    assert main(["cache", "clear"]) == 0
    assert cache_entries() == []
