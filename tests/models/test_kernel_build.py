"""Building the fused kernels into the cache: a killed build, leftover lock files and a live
builder never hang a later start; a damaged library is rebuilt instead of crashing the process;
installs that compile differently get different build directories.

Real compiles (~40 s each) are few: one after a build killed mid-compile (shared by the tests
through a module fixture) and one to rebuild a truncated library."""

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import metagen
from metagen.models import kernels
from metagen.models.disk_cache import read_manifest

CHECK = """
import torch
from metagen.models.kernels import fused_kernels

module = fused_kernels()
x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
weight = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5
out = module.add_rms_norm(x.clone(), None, weight, 1e-5, False)
torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (64,), weight, 1e-5))
print("kernels OK")
"""


def can_compile() -> bool:
    from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available

    return shutil.which(get_cxx_compiler()) is not None and is_ninja_available()


def environment(cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1]), "METAGEN_CACHE": str(cache)}
    env.pop("METAGEN_FUSED_KERNELS", None)
    return env


def run_check(cache: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK], env=environment(cache), capture_output=True, text=True,
                          timeout=timeout)


def lock_is_held(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def built_after_kill(tmp_path_factory):
    """A cache where a first build was killed (SIGKILL) mid-compile holding the lock, then a
    second start built the kernels: (cache, the second start's result, seconds it took)."""
    if not can_compile():
        pytest.skip("no C++ compiler or ninja")
    cache = tmp_path_factory.mktemp("kernel-cache")
    first = subprocess.Popen([sys.executable, "-c", CHECK], env=environment(cache), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(cache.glob("kernels/*.staging-*/build.ninja")):  # torch runs ninja next
            assert first.poll() is None and time.monotonic() < deadline, "the first build never started compiling"
            time.sleep(0.05)
        time.sleep(1.0)  # the compiler is running
        (lock,) = cache.glob("kernels/*.lock")
        assert first.poll() is None and lock_is_held(lock)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the build and its compiler, as Ctrl-C would
        first.wait()
    start = time.monotonic()
    second = run_check(cache, timeout=600)
    return cache, second, time.monotonic() - start


def entry_of(cache: Path) -> Path:
    (entry,) = [item for item in (cache / "kernels").iterdir() if item.is_dir() and ".staging-" not in item.name]
    return entry


@pytest.mark.slow
def test_start_after_a_build_killed_mid_compile_builds_the_kernels(built_after_kill):
    cache, second, _ = built_after_kill
    assert second.returncode == 0 and "kernels OK" in second.stdout, second.stderr[-3000:]
    entry = entry_of(cache)
    assert sorted(item.name for item in entry.iterdir()) == ["manifest.json", read_manifest(entry)["library"]]
    assert not list(cache.glob("kernels/*.staging-*"))  # the killed build's leftovers are gone


@pytest.mark.slow
def test_leftover_empty_lock_files_do_not_block_a_start(built_after_kill, tmp_path):
    """An empty torch `lock` baton in the build directory and an empty lock file: the next start
    loads the built library at once (no wait, no rebuild)."""
    cache = tmp_path / "cache"
    shutil.copytree(built_after_kill[0], cache)
    entry = entry_of(cache)
    (entry / "lock").touch()
    (entry.with_name(entry.name + ".lock")).write_bytes(b"")
    library = entry / read_manifest(entry)["library"]
    before = library.stat().st_mtime_ns
    result = run_check(cache, timeout=120)
    assert result.returncode == 0 and "kernels OK" in result.stdout, result.stderr[-3000:]
    assert "rebuilding" not in result.stderr and "waiting" not in result.stderr
    assert library.stat().st_mtime_ns == before


@pytest.mark.slow
def test_truncated_library_is_rebuilt_instead_of_crashing(built_after_kill, tmp_path):
    """Loading a truncated library kills the process with SIGBUS; its size is checked first."""
    cache = tmp_path / "cache"
    shutil.copytree(built_after_kill[0], cache)
    entry = entry_of(cache)
    library = entry / read_manifest(entry)["library"]
    size = library.stat().st_size
    library.write_bytes(library.read_bytes()[: size // 3])
    result = run_check(cache, timeout=600)
    assert result.returncode == 0 and "kernels OK" in result.stdout, (result.returncode, result.stderr[-3000:])
    assert f"rebuilding the fused kernels: {library} has {size // 3} bytes, but {size} were written" in result.stderr
    assert library.stat().st_size == size


def test_live_builder_is_waited_for_with_a_message_then_the_pytorch_path(tmp_path, lock_holder, capfd):
    directory = tmp_path / "kernels" / "build"
    holder = lock_holder(directory)
    start = time.monotonic()
    with pytest.warns(UserWarning, match="gave up after 1 s .* using the PyTorch path"):
        assert kernels.load_or_build(directory, wait_seconds=1.0) is None
    assert time.monotonic() - start < 5
    assert f"waiting for process {holder.pid} to finish building the fused kernels" in capfd.readouterr().err


def test_build_directory_is_keyed_by_what_goes_into_the_build(monkeypatch):
    """Two installs sharing a cache (same torch version, other include paths) or other flags,
    compiler or python headers get their own build directory instead of rebuilding each other's."""
    import sysconfig

    from torch.utils import cpp_extension

    base = kernels.build_directory(kernels.build_inputs())
    assert kernels.build_directory(kernels.build_inputs()) == base
    changes = [
        (cpp_extension, "include_paths", lambda *a, **k: ["/other-venv/torch/include"]),
        (cpp_extension, "library_paths", lambda *a, **k: ["/other-venv/torch/lib"]),
        (cpp_extension, "get_cxx_compiler", lambda: sys.executable),  # another binary
        (sysconfig, "get_paths", lambda *a, **k: {"include": "/other-python/include"}),
        (kernels, "_CFLAGS", ("-O2",)),
    ]
    directories = set()
    for owner, name, value in changes:
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, value)
            directories.add(kernels.build_directory(kernels.build_inputs()))
    assert len(directories) == len(changes) and base not in directories


@pytest.mark.parametrize("library", ["fused", "matmul"])
def test_every_kernel_call_releases_the_gil(library):
    """Kernel calls touch no Python object, so each releases the GIL (serve's HTTP thread, PEARL's
    drafting thread and eval's workers run meanwhile): observed from inside a call (`gil_held`),
    and every function of the module is defined with the same release guard."""
    import re

    loaded = kernels.fused_kernels() if library == "fused" else kernels.matmul_kernels()
    if loaded is None:
        pytest.skip("the kernels could not be built here")
    assert loaded.gil_held() is False
    source = (Path(metagen.__file__).parent / "models" / "kernels" / f"{library}.cpp").read_text()
    module = source[source.index("PYBIND11_MODULE"):]
    definitions = re.findall(r"m\.def\((.*?)\);", module, flags=re.S)
    assert len(definitions) >= 5
    assert [d.split(",")[0] for d in definitions if not d.rstrip().endswith("release")] == []
