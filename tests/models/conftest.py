import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metagen

LOCK_HOLDER = """
import sys, time
from pathlib import Path
from metagen.models.disk_cache import EntryLock

lock = EntryLock(Path(sys.argv[1]))
assert lock.acquire(0, "a test")
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def lock_holder():
    """Starts another process holding a cache entry's lock (killed at the end of the test)."""
    processes = []

    def start(entry: Path) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1])}
        process = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(entry)], env=env, stdout=subprocess.PIPE,
                                   text=True)
        processes.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait()


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    """An empty $METAGEN_CACHE for one test; models built in it run the PyTorch path, so no
    test compiles the fused or matrix kernels into it by accident (~40 s each; int4 / int8
    linears use the matrix kernels only when this process resolved them before)."""
    from metagen.models import kernels

    cache = tmp_path / "cache"
    monkeypatch.setenv("METAGEN_CACHE", str(cache))
    monkeypatch.setitem(kernels._state, "module", None)
    monkeypatch.setitem(kernels._state, "matmul", None)
    return cache
