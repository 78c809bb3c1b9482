"""Which matrix kernels the linears of `models/linear.py` run: torch's or metagen's compiled ones.

Chosen once per process by METAGEN_KERNELS (the compiled kernels return x's dtype, float32
unrounded or bf16; torch's take and return bf16; a linear's `takes_float` says which):

- "auto" (default): metagen's compiled kernels (models/kernels/matmul.cpp) with the best
  instruction set of this CPU, AVX-512 VNNI or AVX2; torch's kernels when neither is there or the
  library cannot be built. "avx512" / "avx2" force one path (an error if the CPU lacks it).
  They quantize each activation row per block of 32 features — `activations` (a load option,
  `Linear.set_activations`) "int16" (default): 32258 levels each side of zero (a = max|x|/32258,
  an error ≤ 1/64516 of the block's largest value, finer than bf16), taken as two int8 digits;
  "int8": 127 levels, as llama.cpp's Q8_0 (half the multiply-adds, measurably less faithful:
  docs/benchmarks/kernels.md) — take exact integer dot products with the weight codes and fold the
  scales in fp32; a row's result does not depend on the other rows (bit for bit, whatever M is,
  under either setting), and the two instruction sets agree bit for bit.
- "torch": `aten._weight_int8pack_mm` and `aten._weight_int4pack_mm_for_cpu`, bf16 activations.
"""

from __future__ import annotations

import os

BACKENDS = ("auto", "torch", "avx2", "avx512")
ACTIVATIONS = ("int16", "int8")  # the compiled kernels' activation codes (see the module docstring)
DEFAULT_ACTIVATIONS = "int16"
ISA = {"avx2": 1, "avx512": 2}  # the compiled kernels' instruction-set argument
_resolved: dict[str, tuple] = {}  # requested -> (backend, compiled module)


def resolve_backend(backend: str | None = None) -> str:
    """"torch", "avx2" or "avx512": `backend`, else METAGEN_KERNELS (default "auto"), with "auto"
    resolved to the best instruction set the compiled kernels have on this CPU (else "torch").
    Resolved once per process and value (once the compiled library is there)."""
    requested = backend if backend is not None else os.environ.get("METAGEN_KERNELS", "auto")
    if requested not in BACKENDS:
        source = "backend" if backend is not None else "METAGEN_KERNELS"
        raise ValueError(f"{source}={requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "torch":
        return "torch"
    if requested not in _resolved:
        from metagen.models.kernels import matmul_kernels

        module = matmul_kernels()
        best = {2: "avx512", 1: "avx2"}.get(module.best_isa() if module is not None else 0, "torch")
        if requested == "auto":
            chosen = best
        elif best == "torch" or ISA[best] < ISA[requested]:
            raise ValueError(f"kernels {requested!r} requested (METAGEN_KERNELS or backend=): this CPU or build "
                             f"does not support them; the best here is {best!r}")
        else:
            chosen = requested
        if module is None:  # not cached: matmul_kernels() remembers a failed build itself
            return chosen
        _resolved[requested] = (chosen, module)
    return _resolved[requested][0]


def check_activations(activations: str) -> str:
    """`activations` when it is one of ACTIVATIONS, else a ValueError naming the field and the choices."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations={activations!r} is not supported: choose one of {', '.join(ACTIVATIONS)}")
    return activations


def compiled_kernels():
    """The compiled module the resolved backends use (after `resolve_backend` chose one)."""
    return next(module for _, module in _resolved.values() if module is not None)
