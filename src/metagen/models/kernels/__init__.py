"""Fused CPU kernels for the decode step, compiled on first use (torch C++ extension).

`fused_kernels()` returns the compiled module, or None when it cannot be built (no compiler or
ninja) or is disabled with METAGEN_FUSED_KERNELS=0; the model then runs its pure-PyTorch path,
which computes the same thing (tests compare the two). The build is cached under
$METAGEN_CACHE/kernels, keyed by torch version, machine and CPU, so it happens once.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from pathlib import Path

_SOURCE = Path(__file__).with_name("fused.cpp")
_state: dict[str, object] = {}


def _cpu_fingerprint() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def fused_kernels():
    """The compiled kernels module, or None (see the module docstring)."""
    if "module" in _state:
        return _state["module"]
    module = None
    if os.environ.get("METAGEN_FUSED_KERNELS", "1") != "0":
        try:
            import torch
            from torch.utils.cpp_extension import load

            from metagen.models.loading import cache_directory

            tag = f"torch{torch.__version__}-{platform.machine()}-{_cpu_fingerprint()}"
            build = cache_directory() / "kernels" / tag
            build.mkdir(parents=True, exist_ok=True)
            module = load(
                name="metagen_fused",
                sources=[str(_SOURCE)],
                extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
                build_directory=str(build),
                verbose=False,
            )
        except Exception as error:  # no compiler, no ninja, unwritable cache...
            warnings.warn(f"metagen: fused CPU kernels unavailable, using the PyTorch path ({error})", stacklevel=2)
            module = None
    _state["module"] = module
    return module
