"""The weight formats of a linear, each a `linear_base.Linear`: dense (fp32 / bf16) and
weight-only int8 / int4 / grouped, a `ConcatLinear` of parts in different formats, and
`restore_linear`, which builds any of them back from the conversion cache's record.

Weight formats (the stored state; the conversion cache saves it as is):

- int8: `qweight` (N, K) int8 with one bf16 scale per output channel, w = q·s.
- int4: per group of `g` = 32 input features, w = (q − 8)·scale + zero with q ∈ [0, 15] and
  bf16 scale and zero per (output, group), packed in torch's `_convert_weight_to_int4pack_for_cpu`
  layout. GGUF's Q4_1 block (32 weights, w = d·q + m) is exactly this with scale = d and
  zero = m + 8·d; Q4_0 (w = d·(q − 8)) has zero = 0; Q4_K sub-blocks likewise (gguf_blocks.py).
- grouped (`GroupedLinear`): 4-, 5-, 6- or 8-bit codes, a scale (and zero) per group of 16 or 32,
  plain or `Factored` (the K-quants' int8 per group under a float per 256 features).

How a linear is called (`linear(x, out)`) and recorded is `linear_base.Linear`'s. The weights
are repacked at load into the compiled kernels' layout (`models/packing.py`; int4: 16 columns ×
32 features = 320 bytes with their scales and zeros). An int8 matrix holding a −128 code runs
torch's kernel (the AVX2 sign trick needs |q| ≤ 127; `Int8Linear.quantize` never makes one). On
"torch": `aten._weight_int8pack_mm(x, w_int8, scales)` and
`aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros (K/g, N, 2))`, bf16
activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metagen.models.kernel_backend import resolve_backend
from metagen.models.linear_base import Linear, copy_into
from metagen.models.packing import (
    FACTOR_SPAN,
    Factored,
    pack_grouped,
    pack_int4,
    pack_int8,
    torch_int4_pack,
    unpack_grouped,
    unpack_int4,
    unpack_int8,
    unpack_torch_int4,
)

INT4_GROUP = 32

# Resolved once: looking an op up through `torch.ops.aten` costs microseconds per call, and a
# decode step makes ~120 of these calls.
_INT8_MM = torch.ops.aten._weight_int8pack_mm.default
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


class DenseLinear(Linear):
    """y = x·Wᵀ (+ b). weight: (N, K) in the compute dtype."""

    kind = "dense"

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

    def state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight} | ({"bias": self.bias} if self.bias is not None else {})

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict, bias: torch.Tensor | None) -> "DenseLinear":
        return cls(tensors[f"{prefix}.weight"], bias)


class Int8Linear(Linear):
    """Weight-only int8 with per-output-channel scales; x: (..., K) -> (..., N) bf16.

    backend: "torch", "avx2", "avx512", "auto" or None (METAGEN_KERNELS); see the module docstring.
    """

    kind = "int8"

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
            self._use_kernels()
            self._qweight = None
            self.packed = pack_int8(qweight)  # kernel layout, uint8
            self._scales32 = scales.float().contiguous()  # (N,)

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

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend != "torch":
            return self._kernel.int8_matmul(x, self.packed, self._scales32, self.out_features, self.in_features,
                                            self._bias32, self._isa, self._wide, out)
        # torch's kernels take a contiguous matrix (an MLP's activated gate is a slice of gate·up)
        y = _INT8_MM(x.reshape(-1, self.in_features).contiguous(), self._qweight, self.scales)
        y = y.view(*x.shape[:-1], self.out_features)
        return copy_into(out, y if self.bias is None else y + self.bias)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def state(self) -> dict[str, torch.Tensor]:
        out = {"qweight": self.qweight, "scales": self.scales}
        return out | ({"bias": self.bias} if self.bias is not None else {})

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict, bias: torch.Tensor | None) -> "Int8Linear":
        return cls(tensors[f"{prefix}.qweight"], tensors[f"{prefix}.scales"], bias)


class Int4Linear(Linear):
    """Weight-only int4, group-wise scale and zero; x: (..., K) -> (..., N) bf16.

    backend: "torch", "avx2", "avx512", "auto" or None (METAGEN_KERNELS); see the module docstring.
    `codes` (N, K), when the caller has them, saves unpacking `packed`.
    """

    kind = "int4"

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
            self._packed = packed if packed is not None else torch_int4_pack(codes)  # torch's layout, uint8
            self._codes = None
        else:
            self._use_kernels()
            if codes is None:
                codes = unpack_torch_int4(packed, self.out_features, in_features)
            self._packed = None
            self.kernel_weight = pack_int4(codes, scales_and_zeros)  # kernel layout, uint8

    @property
    def packed(self) -> torch.Tensor:
        """The weight in torch's int4 layout (what the conversion cache stores)."""
        if self._packed is not None:
            return self._packed
        return torch_int4_pack(self.codes())

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

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend != "torch":
            return self._kernel.int4_matmul(x, self.kernel_weight, self.out_features, self.in_features, self._bias32,
                                            self._isa, self._wide, out)
        y = _INT4_MM(x.reshape(-1, self.in_features).contiguous(), self._packed, self.group_size, self.scales_and_zeros)
        y = y.view(*x.shape[:-1], self.out_features)
        return copy_into(out, y if self.bias is None else y + self.bias)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: w = (q − 8)·scale + zero with the stored bf16 scale and zero."""
        scales, zeros = self.scales_and_zeros.float().unbind(-1)  # (K/g, N) each
        scales = scales.t().repeat_interleave(self.group_size, dim=1)
        zeros = zeros.t().repeat_interleave(self.group_size, dim=1)
        return (self.codes().float() - 8.0) * scales + zeros

    def state(self) -> dict[str, torch.Tensor]:
        out = {"packed": self.packed, "scales_and_zeros": self.scales_and_zeros}
        return out | ({"bias": self.bias} if self.bias is not None else {})

    def format(self) -> dict:
        return {"group_size": self.group_size}

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict, bias: torch.Tensor | None) -> "Int4Linear":
        return cls(tensors[f"{prefix}.packed"], tensors[f"{prefix}.scales_and_zeros"], info["in_features"], bias,
                   info.get("group_size", INT4_GROUP))


def _exact_half(values: list[torch.Tensor]) -> bool:
    return all(bool((v.float().half().float() == v.float()).all()) for v in values)


class GroupedLinear(Linear):
    """Weight-only 4-, 5-, 6- or 8-bit codes with a scale (and zero) per group of 16 or 32 input
    features: w = (u − o)·s (+ z), u ∈ [0, 2^bits); x: (..., K) -> (..., N) bf16.

    The format of GGUF's Q4_K / Q5_0 / Q5_1 / Q5_K / Q6_K / Q8_0 blocks (`gguf_blocks.group_codes`),
    so those tensors run at their own precision. Plain scales and zeros are kept in fp16 when
    every value is exactly an fp16 (the legacy blocks), else in fp32; `Factored` ones (the K-quants'
    int8 sub-block values under an fp16 d per 256) as such. Bytes per weight: bits/8 + the
    values' (Q4_K 0.58, Q5_K 0.70, Q6_K 0.82, Q5_0 0.69, Q8_0 1.06). The compiled kernels run it;
    on the "torch" backend the weight is dequantized once to bf16 and runs as a dense matrix.
    """


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
            self._use_kernels()
            self._codes = None
            self.packed = pack_grouped(codes, self.scales, self.zeros, bits, group)

    def codes(self) -> torch.Tensor:
        """(N, K) uint8 codes u."""
        if self._codes is not None:
            return self._codes
        return unpack_grouped(self.packed, self.out_features, self.in_features, self.bits, self.group, self.half,
                              self.zeros is not None, self.factored)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend == "torch":
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return copy_into(out, F.linear(x.to(torch.bfloat16), self._dense, bias))
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

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict, bias: torch.Tensor | None) -> "GroupedLinear":
        names = ("codes", "scales", "zeros", "scales_top", "scales_sub", "zeros_top", "zeros_sub")
        state = {name: tensors[f"{prefix}.{name}"] for name in names if f"{prefix}.{name}" in tensors}
        scales, zeros = (cls.restore_values(state, name) for name in ("scales", "zeros"))
        return cls(state["codes"], scales, zeros, info["bits"], info["group"], info["offset"], bias)


class ConcatLinear(Linear):
    """Linears with the same input stacked along the output: y = [y_0, y_1, ...]. A fused
    projection (Q·K·V, gate·up) whose parts a checkpoint stores in different formats runs each
    part in its own."""

    kind = "concat"

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

    def set_activations(self, activations: str) -> None:
        super().set_activations(activations)
        for part in self.parts:
            part.set_activations(activations)

    def record(self, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
        """Each part's record, its tensors under `{prefix}.{i}`."""
        info = {"kind": self.kind, "in_features": self.in_features, "stored": self.stored}
        return info | {"parts": [part.record(f"{prefix}.{i}", tensors) for i, part in enumerate(self.parts)]}

    @classmethod
    def restore(cls, prefix: str, info: dict, tensors: dict, bias: torch.Tensor | None) -> "ConcatLinear":
        return cls([restore_linear(f"{prefix}.{i}", part, tensors) for i, part in enumerate(info["parts"])])


_KINDS = {"dense": DenseLinear, "int8": Int8Linear, "int4": Int4Linear, "concat": ConcatLinear}


def restore_linear(prefix: str, info: dict, tensors: dict[str, torch.Tensor]) -> Linear:
    """The linear whose `record` under `prefix` is `info` (its tensors `{prefix}.{name}` in `tensors`)."""
    kind = GroupedLinear if "bits" in info else _KINDS[info["kind"]]
    linear = kind.restore(prefix, info, tensors, tensors.get(f"{prefix}.bias"))
    linear.stored = info["stored"]
    return linear
