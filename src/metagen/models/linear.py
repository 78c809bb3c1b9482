"""Linear layers for each compute dtype: dense (fp32 / bf16) and weight-only int8 / int4.

Weight formats (the stored state; the conversion cache saves it as is):

- int8: `qweight` (N, K) int8 with one bf16 scale per output channel, w = q·s.
- int4: per group of `g` = 32 input features, w = (q − 8)·scale + zero with q ∈ [0, 15] and
  bf16 scale and zero per (output, group), packed in torch's `_convert_weight_to_int4pack_for_cpu`
  layout. GGUF's Q4_1 block (32 weights, w = d·q + m) is exactly this with scale = d and
  zero = m + 8·d; Q4_0 (w = d·(q − 8)) has zero = 0; Q4_K sub-blocks likewise (gguf_blocks.py).
- grouped (`GroupedLinear`): 4-, 5-, 6- or 8-bit codes, a scale (and zero) per group of 16 or 32,
  plain or `Factored` (the K-quants' int8 per group under a float per 256 features).

Every linear is called as `linear(x)` or `linear(x, out)`: `out`, a caller's (rows, N) buffer with
unit stride along N (a decode step's reused one; a column slice of it for a ConcatLinear's parts),
receives the result, which is returned. The compiled kernels write into it; the torch paths copy.

Two implementations compute x (..., K) -> (..., N), chosen once per process by
METAGEN_KERNELS (the compiled kernels return x's dtype, float32 unrounded or bf16; torch's take
and return bf16; `takes_float` says which):

- "auto" (default): metagen's compiled kernels (models/kernels/matmul.cpp) with the best
  instruction set of this CPU, AVX-512 VNNI or AVX2; torch's kernels when neither is there or the
  library cannot be built. "avx512" / "avx2" force one path (an error if the CPU lacks it).
  They quantize each activation row per block of 32 features — METAGEN_KERNEL_ACTIVATIONS=
  "int16" (default): 32258 levels each side of zero (a = max|x|/32258, an error ≤ 1/64516 of the
  block's largest value, finer than bf16), taken as two int8 digits; "int8": 127 levels, as
  llama.cpp's Q8_0 (half the multiply-adds, measurably less faithful) — take exact integer dot
  products with the weight codes and fold the scales in fp32; a row's result does not depend on
  the other rows (bit for bit, whatever M is), and the two instruction sets agree bit for bit. The weights are repacked at load into the
  kernels' layout (int4: 16 columns × 32 features = 320 bytes with their scales and zeros).
  An int8 matrix holding a −128 code runs torch's kernel (the AVX2 sign trick needs |q| ≤ 127;
  `Int8Linear.quantize` never makes one).
- "torch": `aten._weight_int8pack_mm(x, w_int8, scales)` and
  `aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros (K/g, N, 2))`, bf16
  activations.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

INT4_GROUP = 32
BACKENDS = ("auto", "torch", "avx2", "avx512")
ACTIVATIONS = ("int16", "int8")
_ISA = {"avx2": 1, "avx512": 2}
_resolved: dict[str, tuple] = {}  # requested -> (backend, compiled module)

# Resolved once: looking an op up through `torch.ops.aten` costs microseconds per call, and a
# decode step makes ~120 of these calls.
_INT8_MM = torch.ops.aten._weight_int8pack_mm.default
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


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
        elif best == "torch" or _ISA[best] < _ISA[requested]:
            raise ValueError(f"kernels {requested!r} requested (METAGEN_KERNELS or backend=): this CPU or build "
                             f"does not support them; the best here is {best!r}")
        else:
            chosen = requested
        if module is None:  # not cached: matmul_kernels() remembers a failed build itself
            return chosen
        _resolved[requested] = (chosen, module)
    return _resolved[requested][0]


def wide_activations() -> bool:
    """METAGEN_KERNEL_ACTIVATIONS: "int16" (default) -> True, "int8" -> False."""
    value = os.environ.get("METAGEN_KERNEL_ACTIVATIONS", "int16")
    if value not in ACTIVATIONS:
        raise ValueError(f"METAGEN_KERNEL_ACTIVATIONS={value!r}: choose one of {', '.join(ACTIVATIONS)}")
    return value == "int16"


def _kernels():
    """The compiled module the resolved backends use."""
    return next(module for _, module in _resolved.values() if module is not None)


def _into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """`y`, or `out` holding it (a caller's buffer; the torch backend has no in-place kernel)."""
    return y if out is None else out.copy_(y)


class DenseLinear:
    """y = x·Wᵀ (+ b). weight: (N, K) in the compute dtype."""

    kind = "dense"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape

    @property
    def takes_float(self) -> bool:
        """Whether float32 activations run at full precision (a float32 weight)."""
        return self.weight.dtype == torch.float32

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)

    @property
    def nbytes(self) -> int:
        """Bytes of weights, scales and bias one call reads."""
        return sum(t.nbytes for t in self.state().values())

    def state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight} | ({"bias": self.bias} if self.bias is not None else {})


class Int8Linear:
    """Weight-only int8 with per-output-channel scales; x: (..., K) -> (..., N) bf16.

    backend: "torch", "avx2", "avx512", "auto" or None (METAGEN_KERNELS); see the module docstring.
    """

    kind = "int8"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 backend: str | None = None) -> None:
        self.scales = scales  # (N,) bf16
        self.bias = bias
        self.out_features, self.in_features = qweight.shape
        self.backend = resolve_backend(backend)
        if self.backend != "torch" and qweight.numel() and int(qweight.min()) == -128:
            self.backend = "torch"  # see the module docstring
        if self.backend == "torch":
            self._qweight = qweight  # (N, K) int8
        else:
            self._kernel = _kernels()
            self._isa = _ISA[self.backend]
            self._wide = wide_activations()
            self._qweight = None
            self.packed = pack_int8(qweight)  # kernel layout, uint8
            self._scales32 = scales.float().contiguous()  # (N,)
            self._bias32 = None if bias is None else bias.float().contiguous()

    @property
    def qweight(self) -> torch.Tensor:
        """(N, K) int8 codes."""
        if self._qweight is not None:
            return self._qweight
        return unpack_int8(self.packed, self.out_features, self.in_features)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str | None = None) -> "Int8Linear":
        """Symmetric per-channel quantization: s = max|w_row| / 127, q = round(w / s).

        The kernel takes bf16 scales, so s is rounded up to bf16 first and q computed against
        the rounded scale: every weight is then within half a step of its dequantized value.
        """
        weight = weight.float()
        exact = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        scales = exact.to(torch.bfloat16)
        scales = torch.where(scales.float() < exact, torch.nextafter(scales, torch.tensor(float("inf"), dtype=torch.bfloat16)), scales)
        qweight = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(qweight, scales, None if bias is None else bias.to(torch.bfloat16), backend)

    @property
    def takes_float(self) -> bool:
        """Whether float32 activations run at full precision: the compiled kernels take them (and
        return float32); torch's kernels take bf16."""
        return self.backend != "torch"

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend != "torch":
            return self._kernel.int8_matmul(x, self.packed, self._scales32, self.out_features, self.in_features,
                                            self._bias32, self._isa, self._wide, out)
        # torch's kernels take a contiguous matrix (an MLP's activated gate is a slice of gate·up)
        y = _INT8_MM(x.reshape(-1, self.in_features).contiguous(), self._qweight, self.scales)
        y = y.view(*x.shape[:-1], self.out_features)
        return _into(out, y if self.bias is None else y + self.bias)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    @property
    def nbytes(self) -> int:
        """Bytes of weights, scales and bias one call reads."""
        return sum(t.nbytes for t in self.state().values())

    def state(self) -> dict[str, torch.Tensor]:
        out = {"qweight": self.qweight, "scales": self.scales}
        return out | ({"bias": self.bias} if self.bias is not None else {})


class Int4Linear:
    """Weight-only int4, group-wise scale and zero; x: (..., K) -> (..., N) bf16.

    backend: "torch", "avx2", "avx512", "auto" or None (METAGEN_KERNELS); see the module docstring.
    `codes` (N, K), when the caller has them, saves unpacking `packed`.
    """

    kind = "int4"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(
        self,
        packed: torch.Tensor | None,
        scales_and_zeros: torch.Tensor,
        in_features: int,
        bias: torch.Tensor | None = None,
        group_size: int = INT4_GROUP,
        backend: str | None = None,
        codes: torch.Tensor | None = None,
    ) -> None:
        self.scales_and_zeros = scales_and_zeros  # (K/g, N, 2) bf16
        self.group_size = group_size
        self.in_features = in_features
        self.out_features = scales_and_zeros.shape[1]
        self.bias = bias
        self.backend = resolve_backend(backend)
        if group_size != INT4_GROUP:
            self.backend = "torch"  # the compiled kernels are written for groups of 32
        if self.backend == "torch":
            self._packed = packed if packed is not None else _torch_int4_pack(codes)  # torch's layout, uint8
            self._codes = None
        else:
            self._kernel = _kernels()
            self._isa = _ISA[self.backend]
            self._wide = wide_activations()
            if codes is None:
                codes = unpack_torch_int4(packed, self.out_features, in_features)
            self._packed = None
            self.kernel_weight = pack_int4(codes, scales_and_zeros)  # kernel layout, uint8
            self._bias32 = None if bias is None else bias.float().contiguous()

    @property
    def packed(self) -> torch.Tensor:
        """The weight in torch's int4 layout (what the conversion cache stores)."""
        if self._packed is not None:
            return self._packed
        return _torch_int4_pack(self.codes())

    def codes(self) -> torch.Tensor:
        """(N, K) int32 codes in [0, 15]."""
        if self.backend == "torch":
            return unpack_torch_int4(self._packed, self.out_features, self.in_features)
        return unpack_int4(self.kernel_weight, self.out_features, self.in_features)

    @staticmethod
    def supports(out_features: int, in_features: int, group_size: int = INT4_GROUP) -> bool:
        """The CPU kernels need N divisible by 16 and K by the group size (and by 2)."""
        return out_features % 16 == 0 and in_features % group_size == 0

    @classmethod
    def from_codes(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        bias: torch.Tensor | None = None,
        group_size: int = INT4_GROUP,
        backend: str | None = None,
    ) -> "Int4Linear":
        """codes: (N, K) ints in [0, 15]; scales, zeros: (N, K/g); w = (q − 8)·scale + zero."""
        n, k = codes.shape
        scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
        return cls(None, scales_and_zeros, k, None if bias is None else bias.to(torch.bfloat16), group_size,
                   backend, codes.to(torch.int32).contiguous())

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = INT4_GROUP,
                 backend: str | None = None) -> "Int4Linear":
        """Asymmetric min/max quantization per group of `group_size` input features."""
        weight = weight.float()
        n, k = weight.shape
        groups = weight.view(n, k // group_size, group_size)
        low = groups.amin(dim=-1)
        high = groups.amax(dim=-1)
        scales = ((high - low) / 15.0).clamp(min=1e-12)
        codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).view(n, k)
        return cls.from_codes(codes, scales, low + 8.0 * scales, bias, group_size, backend)

    @property
    def takes_float(self) -> bool:
        """Whether float32 activations run at full precision: the compiled kernels take them (and
        return float32); torch's kernels take bf16."""
        return self.backend != "torch"

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend != "torch":
            return self._kernel.int4_matmul(x, self.kernel_weight, self.out_features, self.in_features, self._bias32,
                                            self._isa, self._wide, out)
        y = _INT4_MM(x.reshape(-1, self.in_features).contiguous(), self._packed, self.group_size, self.scales_and_zeros)
        y = y.view(*x.shape[:-1], self.out_features)
        return _into(out, y if self.bias is None else y + self.bias)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: w = (q − 8)·scale + zero with the stored bf16 scale and zero."""
        scales, zeros = self.scales_and_zeros.float().unbind(-1)  # (K/g, N) each
        scales = scales.t().repeat_interleave(self.group_size, dim=1)
        zeros = zeros.t().repeat_interleave(self.group_size, dim=1)
        return (self.codes().float() - 8.0) * scales + zeros

    @property
    def nbytes(self) -> int:
        """Bytes of weights, scales and bias one call reads."""
        return sum(t.nbytes for t in self.state().values())

    def state(self) -> dict[str, torch.Tensor]:
        out = {"packed": self.packed, "scales_and_zeros": self.scales_and_zeros}
        return out | ({"bias": self.bias} if self.bias is not None else {})


FACTOR_SPAN = 256  # input features under one top value of a `Factored` scale or zero


class Factored:
    """Per-group values stored in two levels, as GGUF's K-quants store their sub-block scales and
    mins: v = fl(top · sub) in float32, `sub` (N, K/group) int8 per group, `top` (N, K/256) float
    per 256 input features. Q4_K / Q5_K: scale d·sc and zero −dmin·m with 6-bit sc, m; Q6_K:
    scale d·sc with int8 sc. One byte per group instead of a float: Q6_K's 6-bit codes take 0.82
    bytes per weight instead of 1.0, Q4_K's 0.58 instead of 0.625."""

    def __init__(self, top: torch.Tensor, sub: torch.Tensor) -> None:
        if top.dim() != 2 or sub.dim() != 2 or top.shape[0] != sub.shape[0] or sub.shape[1] % max(top.shape[1], 1):
            raise ValueError(f"Factored: top (N, K/256) and sub (N, K/group) with the same N, got {tuple(top.shape)} "
                             f"and {tuple(sub.shape)}")
        as_float = sub.float()
        if sub.numel() and ((as_float.round() != as_float).any() or as_float.min() < -128 or as_float.max() > 127):
            raise ValueError("Factored: sub values must be integers in [-128, 127] (int8)")
        self.top, self.sub = top, sub.to(torch.int8)

    @property
    def shape(self) -> torch.Size:
        return self.sub.shape

    def values(self) -> torch.Tensor:
        """(N, K/group) float32: fl(top · sub)."""
        per = self.sub.shape[1] // self.top.shape[1]
        return self.top.float().repeat_interleave(per, dim=1) * self.sub.float()


def _exact_half(values: list[torch.Tensor]) -> bool:
    return all(bool((v.float().half().float() == v.float()).all()) for v in values)


class GroupedLinear:
    """Weight-only 4-, 5-, 6- or 8-bit codes with a scale (and zero) per group of 16 or 32 input
    features: w = (u − o)·s (+ z), u ∈ [0, 2^bits); x: (..., K) -> (..., N) bf16.

    The format of GGUF's Q4_K / Q5_0 / Q5_1 / Q5_K / Q6_K / Q8_0 blocks (`gguf_blocks.group_codes`),
    so those tensors run at their own precision. Plain scales and zeros are kept in fp16 when
    every value is exactly an fp16 (the legacy blocks), else in fp32; `Factored` ones (the K-quants'
    int8 sub-block values under an fp16 d per 256) as such. Bytes per weight: bits/8 + the
    values' (Q4_K 0.58, Q5_K 0.70, Q6_K 0.82, Q5_0 0.69, Q8_0 1.06). The compiled kernels run it;
    on the "torch" backend the weight is dequantized once to bf16 and runs as a dense matrix.
    """

    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor | Factored, zeros: torch.Tensor | Factored | None,
                 bits: int, group: int, offset: int, bias: torch.Tensor | None = None, backend: str | None = None) -> None:
        n, k = codes.shape
        if bits not in (4, 5, 6, 8) or group not in (16, 32) or k % 32:
            raise ValueError(f"grouped weights: bits must be 4, 5, 6 or 8 (got {bits}), group 16 or 32 (got {group}) "
                             f"and in_features a multiple of 32 (got {k})")
        if bits == 8 and (zeros is not None or offset != 128 or int(codes.min()) == 0):
            raise ValueError("grouped weights: 8-bit codes must be symmetric (offset 128, no zeros, no code 0)")
        if not 0 <= offset < 2**bits or scales.shape != (n, k // group) or (zeros is not None and zeros.shape != scales.shape):
            raise ValueError(f"grouped weights: offset {offset} must be in [0, {2**bits}) and scales / zeros of shape "
                             f"({n}, {k // group}), got {tuple(scales.shape)}")
        self.factored = isinstance(scales, Factored)
        if zeros is not None and isinstance(zeros, Factored) != self.factored:
            raise ValueError("grouped weights: scales and zeros must both be Factored or both plain")
        if self.factored and (k % FACTOR_SPAN or scales.top.shape[1] != k // FACTOR_SPAN):
            raise ValueError(f"grouped weights: Factored values need in_features divisible by {FACTOR_SPAN} (got {k}) "
                             f"and one top value per {FACTOR_SPAN} features")
        self.bits, self.group, self.offset = bits, group, offset
        self.out_features, self.in_features = n, k
        self.kind = f"int{bits}g{group}" + ("k" if self.factored else "")
        values = [scales] + ([] if zeros is None else [zeros])
        if self.factored:
            self.half = _exact_half([v.top for v in values])
            top_dtype = torch.float16 if self.half else torch.float32
            self.scales = Factored(scales.top.to(top_dtype), scales.sub)
            self.zeros = None if zeros is None else Factored(zeros.top.to(top_dtype), zeros.sub)
        else:
            self.half = _exact_half(values)
            value_dtype = torch.float16 if self.half else torch.float32
            self.scales = scales.to(value_dtype)
            self.zeros = None if zeros is None else zeros.to(value_dtype)
        self.bias = bias
        self.backend = resolve_backend(backend)
        if self.backend == "torch":
            self._codes = codes.to(torch.uint8)
            self._dense = self.dequantize().to(torch.bfloat16)
        else:
            self._kernel = _kernels()
            self._isa = _ISA[self.backend]
            self._wide = wide_activations()
            self._codes = None
            self.packed = pack_grouped(codes, self.scales, self.zeros, bits, group)
            self._bias32 = None if bias is None else bias.float().contiguous()

    def codes(self) -> torch.Tensor:
        """(N, K) uint8 codes u."""
        if self._codes is not None:
            return self._codes
        return unpack_grouped(self.packed, self.out_features, self.in_features, self.bits, self.group, self.half,
                              self.zeros is not None, self.factored)

    @property
    def takes_float(self) -> bool:
        """Whether float32 activations run at full precision: the compiled kernels take them (and
        return float32); torch's kernels take bf16."""
        return self.backend != "torch"

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend == "torch":
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return _into(out, F.linear(x.to(torch.bfloat16), self._dense, bias))
        return self._kernel.grouped_matmul(x, self.packed, self.out_features, self.in_features, self._bias32, self._isa,
                                           self._wide, self.bits, self.group, self.zeros is not None, self.half,
                                           self.factored, self.offset, out)

    def values(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scales, zeros) per group as float32 (N, K/group) (zeros None when the format has none)."""
        plain = [None if v is None else v.values() if self.factored else v.float() for v in (self.scales, self.zeros)]
        return plain[0], plain[1]

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: w = (u − o)·s (+ z)."""
        scales, zeros = self.values()
        w = (self.codes().float() - self.offset) * scales.repeat_interleave(self.group, dim=1)
        return w if zeros is None else w + zeros.repeat_interleave(self.group, dim=1)

    @property
    def nbytes(self) -> int:
        """Bytes of codes, scales, zeros and bias one call reads (the kernel layout)."""
        weight = self._dense if self.backend == "torch" else self.packed
        return weight.nbytes + (0 if self.bias is None else self.bias.nbytes)

    def format(self) -> dict:
        """What the conversion cache records besides the tensors."""
        return {"bits": self.bits, "group": self.group, "offset": self.offset, "factored": self.factored}

    def state(self) -> dict[str, torch.Tensor]:
        out = {"codes": self.codes()}
        for name, value in (("scales", self.scales), ("zeros", self.zeros)):
            if isinstance(value, Factored):
                out |= {f"{name}_top": value.top, f"{name}_sub": value.sub}
            elif value is not None:
                out[name] = value
        return out | ({"bias": self.bias} if self.bias is not None else {})

    @staticmethod
    def restore_values(state: dict[str, torch.Tensor], name: str) -> torch.Tensor | Factored | None:
        """`name`'s ("scales" / "zeros") values from `state()`'s tensors."""
        if f"{name}_top" in state:
            return Factored(state[f"{name}_top"], state[f"{name}_sub"])
        return state[name].float() if name in state else None


class ConcatLinear:
    """Linears with the same input stacked along the output: y = [y_0, y_1, ...]. A fused
    projection (Q·K·V, gate·up) whose parts a checkpoint stores in different formats runs each
    part in its own."""

    kind = "concat"
    stored = ""

    def __init__(self, parts: list) -> None:
        if len(parts) < 2 or len({p.in_features for p in parts}) != 1:
            raise ValueError("ConcatLinear takes two or more linears with the same in_features")
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = None  # the parts hold their own

    @property
    def takes_float(self) -> bool:
        return all(part.takes_float for part in self.parts)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            return torch.cat([part(x) for part in self.parts], dim=-1)
        start = 0
        for part in self.parts:  # each part writes its columns of `out` in place
            part(x, out[:, start : start + part.out_features])
            start += part.out_features
        return out

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


# ---------------------------------------------------------------- layouts (see kernels/matmul.cpp)
# Columns in tiles of 16, features in blocks of 32; a 64-byte chunk holds 16 columns × 4 features.

def pack_int4(codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """codes (N, K) in [0, 15], scales_and_zeros (K/32, N, 2) bf16 -> the int4 kernel layout.

    Per tile t and block g, 320 bytes: chunk c ∈ 0..3, byte 4j + b = q[16t + j, 32g + 4c + b] |
    q[16t + j, 32g + 16 + 4c + b] << 4; then the 16 scales and the 16 zeros (bf16)."""
    n, k = codes.shape
    tiles, blocks = n // 16, k // 32
    q = codes.to(torch.uint8).view(tiles, 16, blocks, 2, 4, 4)  # (t, j, g, half, c, b)
    nibbles = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 256)
    scales = scales_and_zeros[..., 0].reshape(blocks, tiles, 16).transpose(0, 1).contiguous().view(torch.uint8)
    zeros = scales_and_zeros[..., 1].reshape(blocks, tiles, 16).transpose(0, 1).contiguous().view(torch.uint8)
    return torch.cat([nibbles, scales, zeros], dim=-1).contiguous().view(-1)


def unpack_int4(weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int32 codes of an int4 kernel-layout weight (inverse of pack_int4)."""
    tiles, blocks = n // 16, k // 32
    nibbles = weight.view(tiles, blocks, 320)[..., :256].reshape(tiles, blocks, 4, 16, 4)  # (t, g, c, j, b)
    halves = torch.stack([nibbles & 15, nibbles >> 4], dim=2)  # (t, g, half, c, j, b)
    return halves.permute(0, 4, 1, 2, 3, 5).reshape(n, k).to(torch.int32)


def pack_int8(qweight: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 -> the int8 kernel layout: N padded to 16 and K to 32 with zero codes, per
    tile t and block g 512 bytes, chunk c ∈ 0..7, byte 4j + b = q[16t + j, 32g + 4c + b] + 128."""
    n, k = qweight.shape
    tiles, blocks = -(-n // 16), -(-k // 32)
    padded = F.pad(qweight.to(torch.int16), (0, blocks * 32 - k, 0, tiles * 16 - n)) + 128
    q = padded.to(torch.uint8).view(tiles, 16, blocks, 8, 4)  # (t, j, g, c, b)
    return q.permute(0, 2, 3, 1, 4).contiguous().view(-1)


def unpack_int8(weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int8 codes of an int8 kernel-layout weight (inverse of pack_int8)."""
    tiles, blocks = -(-n // 16), -(-k // 32)
    q = weight.view(tiles, blocks, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(tiles * 16, blocks * 32)
    return (q[:n, :k].to(torch.int16) - 128).to(torch.int8)


def _grouped_values(values: torch.Tensor, tiles: int, blocks: int) -> torch.Tensor:
    """(N, K/g) fp16 / fp32 -> (tiles, blocks, bytes): per block its groups' 16 values each."""
    n = values.shape[0]
    padded = F.pad(values, (0, 0, 0, tiles * 16 - n))
    per_block = padded.shape[1] // blocks
    v = padded.view(tiles, 16, blocks, per_block).permute(0, 2, 3, 1).contiguous()
    return v.view(torch.uint8).reshape(tiles, blocks, -1)


def pack_grouped(codes: torch.Tensor, scales: torch.Tensor | Factored, zeros: torch.Tensor | Factored | None, bits: int,
                 group: int) -> torch.Tensor:
    """codes (N, K) in [0, 2^bits), scales / zeros (N, K/group) fp16 or fp32 -> the grouped kernel
    layout (kernels/matmul.cpp): N padded to 16 (codes 128 for 8 bits, else 0; scales 0). Per
    tile t and block g: 8-bit: 8 chunks × 64 bytes, byte 4j + b of chunk c = u[16t + j, 32g + 4c + b];
    5 / 6 bits: int4's 256 bytes of low nibbles, then 64-byte planes of the high bits laid out like
    a chunk: 5 bits, bit c of byte 4j + b = bit 4 of u[16t + j, 32g + 4c + b]; 6 bits, two planes
    (chunks 0-3, 4-7) holding bits 4-5 of chunk c's code at bits 2(c mod 4), +1; 4 bits: the
    nibbles alone; then the scales (and zeros). Factored values: the int8 subs per block, and
    every 8 blocks preceded by the 16 columns' top scales (and zeros)."""
    n, k = codes.shape
    tiles, blocks = -(-n // 16), k // 32
    u = F.pad(codes.to(torch.int32), (0, 0, 0, tiles * 16 - n), value=128 if bits == 8 else 0).to(torch.uint8)
    chunks = u.view(tiles, 16, blocks, 8, 4).permute(0, 2, 3, 1, 4)  # (t, g, c, j, b)
    if bits == 8:
        parts = [chunks.reshape(tiles, blocks, 512)]
    elif bits == 4:
        parts = [(chunks[:, :, :4] | (chunks[:, :, 4:] << 4)).reshape(tiles, blocks, 256)]
    else:
        low = chunks[:, :, :4] & 15
        high = chunks[:, :, 4:] & 15
        parts = [(low | (high << 4)).reshape(tiles, blocks, 256)]
        high = (chunks.to(torch.int32) >> 4).reshape(tiles, blocks, 8, 64)  # (t, g, c, lane)
        if bits == 5:  # one plane: bit c of lane byte = bit 4 of chunk c's code
            planes = [(high << torch.arange(8, dtype=torch.int32)[:, None]).sum(2)]
        else:  # two planes (chunks 0-3, 4-7): bits 2c', 2c' + 1 = bits 4, 5 of chunk 4p + c'
            shifts = (2 * torch.arange(4, dtype=torch.int32))[:, None]
            planes = [(high[:, :, 4 * p : 4 * p + 4] << shifts).sum(2) for p in range(2)]
        parts += [plane.to(torch.uint8) for plane in planes]
    values = [v for v in (scales, zeros) if v is not None]
    if not isinstance(scales, Factored):
        return torch.cat(parts + [_grouped_values(v, tiles, blocks) for v in values], dim=-1).contiguous().view(-1)
    supers = blocks // 8
    per_block = torch.cat(parts + [_grouped_values(v.sub, tiles, blocks) for v in values], dim=-1)
    tops = torch.cat([_grouped_values(v.top, tiles, supers) for v in values], dim=-1)
    return torch.cat([tops, per_block.reshape(tiles, supers, -1)], dim=-1).contiguous().view(-1)


def unpack_grouped(weight: torch.Tensor, n: int, k: int, bits: int, group: int, half: bool, zero: bool,
                   factored: bool = False) -> torch.Tensor:
    """The (N, K) uint8 codes of a grouped kernel-layout weight (inverse of pack_grouped)."""
    tiles, blocks = -(-n // 16), k // 32
    code_bytes = 512 if bits == 8 else 256 + (bits - 4) * 64
    value_bytes = (32 // group) * 16 * (1 if factored else 2 if half else 4)
    block_bytes = code_bytes + value_bytes * (2 if zero else 1)
    if factored:
        top_bytes = 16 * (2 if half else 4) * (2 if zero else 1)
        b = weight.view(tiles, blocks // 8, top_bytes + 8 * block_bytes)[..., top_bytes:].reshape(tiles, blocks, block_bytes)
    else:
        b = weight.view(tiles, blocks, block_bytes)
    if bits == 8:
        chunks = b[..., :512].reshape(tiles, blocks, 8, 16, 4)
    elif bits == 4:
        nibbles = b[..., :256].reshape(tiles, blocks, 4, 16, 4)
        chunks = torch.cat([nibbles & 15, nibbles >> 4], dim=2)
    else:
        nibbles = b[..., :256].reshape(tiles, blocks, 4, 16, 4)
        chunks = torch.cat([nibbles & 15, nibbles >> 4], dim=2).to(torch.int32)  # (t, g, c, j, b)
        planes = b[..., 256 : 256 + 64 * (bits - 4)].reshape(tiles, blocks, bits - 4, 1, 64).to(torch.int32)
        if bits == 5:
            high = (planes[:, :, 0] >> torch.arange(8, dtype=torch.int32)[:, None]) & 1  # (t, g, c, lane)
        else:
            high = ((planes >> (2 * torch.arange(4, dtype=torch.int32))[:, None]) & 3).reshape(tiles, blocks, 8, 64)
        chunks = chunks | (high.reshape(tiles, blocks, 8, 16, 4) << 4)
        chunks = chunks.to(torch.uint8)
    return chunks.permute(0, 3, 1, 2, 4).reshape(tiles * 16, k)[:n].contiguous()


def unpack_torch_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int32 codes of torch's CPU int4 layout: rows in blocks of B (64 where torch's
    kernels use AVX-512, 32 with AVX2: `_torch_int4_block`), each block (K, B/2) bytes with row j
    in the low and row B/2 + j in the high nibble; a last block of fewer rows holds rows 2j and
    2j + 1 in byte j."""
    size = _torch_int4_block()
    flat = packed.view(-1)
    full = n // size * size  # the rows in whole blocks, all at once
    blocks = flat[: full * k // 2].view(n // size, k, size // 2)
    low, high = (blocks & 15).to(torch.int32), (blocks >> 4).to(torch.int32)
    out = [torch.cat([low, high], dim=2).transpose(1, 2).reshape(full, k)]
    if full < n:
        block = flat[full * k // 2 :].view(k, (n - full) // 2)
        low, high = (block & 15).to(torch.int32), (block >> 4).to(torch.int32)
        out.append(torch.stack([low, high], dim=2).reshape(k, n - full).t())
    return torch.cat(out).contiguous()


@functools.lru_cache(maxsize=1)
def _torch_int4_block() -> int:
    """The rows per block of torch's CPU int4 layout on this machine: its packing kernel is
    compiled per ISA (64 rows with AVX-512, 32 with AVX2), so it is read off a probe of 64 rows
    packed once and unpacked each known way. RuntimeError if none gives the codes back."""
    k = 32
    codes = torch.randint(0, 16, (64, k), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    flat = _torch_int4_pack(codes).view(-1)
    for size in (64, 32, 16):
        blocks = flat.view(64 // size, k, size // 2)
        unpacked = torch.cat([blocks & 15, blocks >> 4], dim=2).to(torch.int32).transpose(1, 2).reshape(64, k)
        if torch.equal(unpacked, codes):
            return size
    raise RuntimeError("torch's CPU int4 layout on this machine is none of the known ones (blocks of 64, 32 or 16 "
                       "rows): metagen cannot read int4 weights packed by torch here")


def _torch_int4_pack(codes: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
