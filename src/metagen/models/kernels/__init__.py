"""CPU kernels for the decode step, compiled on first use (torch C++ extensions).

Two libraries, each built and cached the same way:
- `fused_kernels()` (fused.cpp): norms, RoPE + cache write, paged attention, top-p, bitmask;
  None when it cannot be built (no compiler or ninja) or is disabled with
  METAGEN_FUSED_KERNELS=0; the model then runs its pure-PyTorch path, which computes the same
  thing (tests compare the two).
- `matmul_kernels()` (matmul.cpp): the int4 / int8 weight-only matrix kernels that
  models/linear.py uses (see there for METAGEN_KERNELS); None when it cannot be built.

The build is an entry of the on-disk cache (`disk_cache`): `$METAGEN_CACHE/kernels/<key>/`
holding the compiled library and its manifest. The key hashes everything that goes into the
build (source, flags, torch version, include and library paths, python version and headers,
compiler binary, CPU flags), so two installs sharing a cache (two virtual environments with the
same torch) get one build each instead of rebuilding over each other's. A process compiles into
a staging directory under the entry's flock and renames it into place; later starts check the
library's size and CRC-32 before loading it, because a truncated library crashes the process
with SIGBUS when it is loaded. A damaged build is rebuilt with a warning; a process waits for
another one's build at most BUILD_WAIT_SECONDS (with a message), then uses the PyTorch path.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path

_NAME = "metagen_fused"
_SOURCE = Path(__file__).with_name("fused.cpp")
_CFLAGS = ("-O3", "-march=native", "-fopenmp")
# The matrix kernels pick their instruction set at run time (functions compiled for AVX2 and for
# AVX-512 with target attributes), so they are built for the baseline CPU: the AVX2 path then
# uses AVX2 only, also on a machine with AVX-512.
_MATMUL = ("metagen_matmul", Path(__file__).with_name("matmul.cpp"), ("-O3", "-fopenmp"))


def _library(library: str) -> tuple[str, Path, tuple[str, ...]]:
    """(module name, source, compiler flags) of "fused" or "matmul"."""
    return (_NAME, _SOURCE, _CFLAGS) if library == "fused" else _MATMUL
BUILD_WAIT_SECONDS = 300.0  # a build takes ~40 s on 2 cores
_state: dict[str, object] = {}


def fused_kernels():
    """The compiled kernels module, or None (see the module docstring)."""
    if "module" in _state:
        return _state["module"]
    module = None
    if os.environ.get("METAGEN_FUSED_KERNELS", "1") != "0":
        module = _build_or_warn("fused")
    _state["module"] = module
    return module


def matmul_kernels():
    """The compiled int4 / int8 matrix kernels module, or None when it cannot be built."""
    if "matmul" not in _state:
        _state["matmul"] = _build_or_warn("matmul")
    return _state["matmul"]


def _build_or_warn(library: str):
    try:
        return load_or_build(build_directory(build_inputs(library)), library=library)
    except Exception as error:  # no compiler, no ninja, unwritable cache...
        warnings.warn(f"metagen: {library} CPU kernels unavailable, using the PyTorch path ({error})", stacklevel=3)
        return None


def _cpu_fingerprint() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def _compiler_identity() -> str:
    """The compiler torch would run, resolved to its binary, with that binary's size and mtime."""
    from torch.utils.cpp_extension import get_cxx_compiler

    command = get_cxx_compiler()
    found = shutil.which(command.split()[0]) if command.split() else None
    if found is None:
        return f"{command} (not found)"
    binary = Path(found).resolve()
    stat = binary.stat()
    return f"{command} -> {binary}:{stat.st_size}:{stat.st_mtime_ns}"


def build_inputs(library: str = "fused") -> dict[str, str]:
    """Everything that goes into the compiled library; a change in any one means another build."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    name, source, cflags = _library(library)
    return {
        "library": name,
        "source": hashlib.sha256(source.read_bytes()).hexdigest(),
        "cflags": " ".join(cflags),
        "torch": torch.__version__,
        "torch_include": os.pathsep.join(cpp_extension.include_paths()),
        "torch_library": os.pathsep.join(cpp_extension.library_paths()),
        "cxx11_abi": str(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": sys.version,
        "python_include": sysconfig.get_paths()["include"],
        "extension_suffix": str(sysconfig.get_config_var("EXT_SUFFIX")),
        "compiler": _compiler_identity(),
        "machine": platform.machine(),
        "cpu": _cpu_fingerprint(),
    }


def build_directory(inputs: dict[str, str]) -> Path:
    """$METAGEN_CACHE/kernels/torch<version>-<hash of all inputs>."""
    from metagen.models.disk_cache import cache_directory

    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return cache_directory() / "kernels" / f"torch{inputs['torch']}-{digest}"


def load_or_build(directory: Path, wait_seconds: float | None = None, library: str = "fused"):
    """The library in `directory` when it matches its manifest, else a fresh build published there.

    Returns None (with a warning) when another process holds the build lock for over
    `wait_seconds` (default BUILD_WAIT_SECONDS).
    """
    from metagen.models.disk_cache import EntryLock, cache_hit, manifest_problem, publish_entry, staging_directory

    wait_seconds = BUILD_WAIT_SECONDS if wait_seconds is None else wait_seconds
    if cache_hit(directory):
        return _import_library(directory)
    with EntryLock(directory) as lock:
        if not lock.acquire(wait_seconds, f"building the {library} kernels in {directory}"):
            warnings.warn(f"metagen: gave up after {wait_seconds:g} s waiting for another process building the "
                          f"{library} kernels in {directory}; using the PyTorch path", stacklevel=3)
            return None
        problem = manifest_problem(directory)
        if problem is None:  # built by the process we waited for
            return _import_library(directory)
        if directory.exists():
            warnings.warn(f"metagen: rebuilding the {library} kernels: {problem}", stacklevel=3)
        with staging_directory(directory) as staging:
            module = _compile(staging, library)
            library = Path(module.__file__).name
            for item in staging.iterdir():  # keep only the library (objects, ninja files, torch's baton)
                if item.name != library:
                    shutil.rmtree(item) if item.is_dir() else item.unlink()
            publish_entry(staging, directory, module=module.__name__, library=library)
        return module


def _compile(staging: Path, library: str = "fused"):
    from torch.utils.cpp_extension import load

    name, source, cflags = _library(library)
    return load(name=name, sources=[str(source)], extra_cflags=list(cflags), build_directory=str(staging),
                verbose=False)


def _import_library(directory: Path):
    """Import the verified library of `directory` (torch first: the library links against it)."""
    import importlib.util

    import torch  # noqa: F401

    from metagen.models.disk_cache import read_manifest

    manifest = read_manifest(directory)
    spec = importlib.util.spec_from_file_location(manifest["module"], directory / manifest["library"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
