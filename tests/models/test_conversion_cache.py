"""The conversion cache: a damaged entry is detected, reported and converted again (never
loaded as garbage); concurrent converting and loading processes never see half-written files."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import metagen
from metagen.models import load

PROMPT = [1, 504, 3458, 282, 4649, 314]
ENTRY_FILES = ["weights.safetensors", "config.json", "linears.json", "tokenizer/tokenizer.json"]


def logits(model) -> torch.Tensor:
    return model.forward(model.new_cache(1), [PROMPT], logits="all").logits


def entry_of(cache: Path) -> Path:
    """The one conversion entry in `cache` (entries are named by a hex key, without dots)."""
    (entry,) = [item for item in cache.iterdir() if item.is_dir() and "." not in item.name]
    return entry


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # overwrite bytes in the middle, keeping the size
        middle = len(data) // 2
        data[middle : middle + 16] = bytes(b ^ 0x5A for b in data[middle : middle + 16])
        path.write_bytes(data)


@pytest.mark.parametrize("how", ["overwrite", "truncate"])
@pytest.mark.parametrize("name", ENTRY_FILES)
def test_damaged_entry_is_reconverted_with_a_warning(name, how, tiny_checkpoint, temp_cache):
    expected = logits(load(tiny_checkpoint, "fp32", use_cache=False))
    load(tiny_checkpoint, "fp32")  # converts and writes the entry
    damage(entry_of(temp_cache) / name, how)
    with pytest.warns(UserWarning, match=f"damaged cache entry .*{name}"):
        model = load(tiny_checkpoint, "fp32")
    torch.testing.assert_close(logits(model), expected, atol=0, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the entry was rewritten: the next load is clean
        torch.testing.assert_close(logits(load(tiny_checkpoint, "fp32")), expected, atol=0, rtol=0)


def test_overwritten_weights_would_change_the_output(tiny_checkpoint, temp_cache):
    """The damage of the test above matters: loaded without the check, it changes the logits."""
    from metagen.models.conversion_cache import _load_converted

    expected = logits(load(tiny_checkpoint, "fp32"))
    entry = entry_of(temp_cache)
    damage(entry / "weights.safetensors", "overwrite")
    assert not torch.equal(logits(_load_converted(entry, "fp32", str(tiny_checkpoint))), expected)


def test_entry_without_manifest_is_reconverted_and_staging_leftovers_removed(tiny_checkpoint, temp_cache):
    """A killed writer leaves a staging directory; an entry without a manifest is never loaded."""
    load(tiny_checkpoint, "fp32")
    entry = entry_of(temp_cache)
    (entry / "manifest.json").unlink()
    leftover = entry.with_name(entry.name + ".staging-dead")
    leftover.mkdir()
    (leftover / "weights.safetensors").write_bytes(b"partial")
    with pytest.warns(UserWarning, match="manifest.json is missing"):
        load(tiny_checkpoint, "fp32")
    assert (entry / "manifest.json").is_file()
    assert not leftover.exists()


WORKER = """
import os, sys, time
import safetensors.torch
from metagen.models import load

path, base, worker, workers, rounds = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])


def slow_save_file(tensors, filename, metadata=None):  # a slow disk: 1 s to start, then 0.5 s of writing
    data = safetensors.torch.save(tensors, metadata)
    time.sleep(1.0)
    with open(filename, "wb") as handle:
        for start in range(0, len(data), len(data) // 10 + 1):
            handle.write(data[start : start + len(data) // 10 + 1])
            handle.flush()
            time.sleep(0.05)


safetensors.torch.save_file = slow_save_file
for index in range(rounds):
    barrier = os.path.join(base, f"barrier-{index}")  # start each round together...
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, str(worker)), "w").close()
    deadline = time.monotonic() + 30  # (a worker that crashed never arrives)
    while len(os.listdir(barrier)) < workers and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.6 * worker)  # ...then one after the other, while the first is still converting
    os.environ["METAGEN_CACHE"] = os.path.join(base, f"cache-{index}")
    for _ in range(3):
        model = load(path, "fp32")
        out = model.forward(model.new_cache(1), [[1, 504, 3458]]).logits
        print(index, out.double().sum().item(), flush=True)
"""


def test_concurrent_converters_and_loaders_never_crash(tiny_checkpoint, tmp_path):
    """Three processes load the same checkpoint, starting 0.3 s apart, on a slow disk (writing
    the weights takes a second), in two rounds with a fresh cache: every load succeeds and gives
    the same logits. When entries were written in place, the processes that found no entry
    converted too, and rewrote its files while the first one loaded them ("incomplete metadata",
    "EOF while parsing")."""
    env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1]), "METAGEN_FUSED_KERNELS": "0"}
    workers, rounds = 3, 2
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tiny_checkpoint), str(tmp_path), str(worker), str(workers), str(rounds)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for worker in range(workers)
    ]
    results = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, results):
        assert process.returncode == 0, stderr[-3000:]
    lines = [line.split() for stdout, _ in results for line in stdout.split("\n") if line]
    assert len(lines) == workers * rounds * 3
    assert len({value for _, value in lines}) == 1  # the same logits from every load


@pytest.mark.slow
def test_embedded_model_damaged_weights_give_the_right_logits(temp_cache):
    """The reported case: bytes overwritten in the cached int4 weights of the embedded model."""
    from metagen.models.conversion_cache import _load_converted

    expected = logits(load())
    entry = entry_of(temp_cache)
    damage(entry / "weights.safetensors", "overwrite")
    assert not torch.equal(logits(_load_converted(entry, "int4", "embedded")), expected)  # garbage if loaded
    with pytest.warns(UserWarning, match="weights.safetensors does not match the checksum"):
        model = load()
    torch.testing.assert_close(logits(model), expected, atol=0, rtol=0)


def test_conversions_are_bounded_by_the_cache_limit(tiny_checkpoint, temp_cache, monkeypatch):
    """Each conversion names its checkpoint and dtype; a new one evicts the least recently used
    conversion once the cache is over METAGEN_CACHE_LIMIT, and a hit counts as a use."""
    from metagen.models import disk_cache
    from metagen.models.disk_cache import cache_entries

    load(tiny_checkpoint, "fp32")
    load(tiny_checkpoint, "int8")
    (fp32, int8) = cache_entries()
    assert (fp32.source, int8.source) == (str(tiny_checkpoint), str(tiny_checkpoint))
    assert [disk_cache.read_manifest(entry.path)["dtype"] for entry in (fp32, int8)] == ["fp32", "int8"]
    for entry, age in ((fp32, 2000), (int8, 1000)):
        os.utime(entry.path / "manifest.json", (os.path.getmtime(entry.path) - age,) * 2)
    load(tiny_checkpoint, "fp32")  # a hit: fp32 is now the most recently used
    monkeypatch.setenv("METAGEN_CACHE_LIMIT", str(fp32.size + int8.size))
    load(tiny_checkpoint, "int4")  # over the limit: int8, the least recently used, goes
    assert [disk_cache.read_manifest(entry.path)["dtype"] for entry in cache_entries()] == ["fp32", "int4"]
