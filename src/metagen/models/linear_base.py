"""`Linear`, what every weight format of `models/linear.py` is: its calling convention, what it
reports and how the conversion cache records it.

Every linear is called as `linear(x)` or `linear(x, out)`: `out`, a caller's (rows, N) buffer
with unit stride along N (a decode step's reused one; a column slice of it for a ConcatLinear's
parts), receives the result, which is returned. The compiled kernels write into it; the torch
paths copy (`copy_into`). Which kernels run (`backend`) is `kernel_backend.resolve_backend`'s
choice; a format running them binds them with `Linear._use_kernels`.

What the conversion cache stores of a linear is `Linear.record` (its kind, in_features, stored
format, `format()` and its `state()` tensors); `linear.restore_linear` builds it back.
"""

from __future__ import annotations

import torch

from metagen.models.kernel_backend import DEFAULT_ACTIVATIONS, ISA, check_activations, compiled_kernels


def copy_into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """`y`, or `out` holding it (a caller's buffer; the torch backend has no in-place kernel)."""
    return y if out is None else out.copy_(y)


class Linear:
    """x (..., K) -> y (..., N) = x·Wᵀ (+ b) with W (N, K) in some stored format.

    What every linear has: `kind` (its format's name in the conversion cache), `in_features` K,
    `out_features` N, `bias` (N,) or None, `stored` (the checkpoint format(s) the weight was
    converted from, e.g. "Q5_0"; set by the loader), `backend` ("torch" or a compiled kernel's
    instruction set), `takes_float` (whether float32 activations run at full precision: the
    compiled kernels take them and return float32; torch's quantized kernels take bf16),
    `nbytes` (bytes one call reads), `state()` (the tensors the conversion cache stores),
    `format()` (what else it records) and `activations` ("int16" or "int8": the codes the
    compiled kernels quantize x to, `set_activations`; a run-time choice the cache does not store)."""

    kind = ""
    stored = ""
    backend = "torch"
    activations = DEFAULT_ACTIVATIONS
    _wide = True  # activations == "int16", the compiled kernels' argument
    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__")

    @property
    def takes_float(self) -> bool:
        return self.backend != "torch"

    @property
    def nbytes(self) -> int:
        """Bytes of weights, scales and bias one call reads."""
        return sum(t.nbytes for t in self.state().values())

    def set_activations(self, activations: str) -> None:
        """Quantize x per block of 32 to "int16" codes (default) or "int8" ones (llama.cpp's Q8_0:
        half the multiply-adds, a larger error) in the compiled kernels; no effect on torch's."""
        self.activations = check_activations(activations)
        self._wide = activations == "int16"

    def state(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} does not define state()")

    def format(self) -> dict:
        """What the conversion cache records besides the kind, in_features, stored and tensors."""
        return {}

    def record(self, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
        """The conversion cache's record of this linear; its tensors go into `tensors` as
        `{prefix}.{name}`. `restore_linear` is the inverse."""
        info = {"kind": self.kind, "in_features": self.in_features, "stored": self.stored} | self.format()
        for name, tensor in self.state().items():
            tensors[f"{prefix}.{name}"] = tensor.contiguous()
        return info

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict[str, torch.Tensor], bias: torch.Tensor | None) -> "Linear":
        """The linear `record` stored under `prefix` (tensors `{prefix}.{name}`)."""
        raise NotImplementedError(f"{cls.__name__} cannot be restored")

    def _use_kernels(self) -> None:
        """Bind the compiled kernels of `self.backend` (not "torch") and the float32 bias they take."""
        self._kernel = compiled_kernels()
        self._isa = ISA[self.backend]
        self._bias32 = None if self.bias is None else self.bias.float().contiguous()
