"""Linear layers for each compute dtype: dense (fp32 / bf16) and weight-only int8 / int4.

Weight-only quantized layers keep activations in bf16 and use torch's CPU kernels:

- int8: `aten._weight_int8pack_mm(x, w_int8 (N, K), scales (N,))` — one scale per output
  channel, y = x · (w · s)ᵀ.
- int4: `aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros (K/g, N, 2))` —
  per group of `g` input features, w = (q − 8)·scale + zero with q ∈ [0, 15]. GGUF's Q4_1 block
  (32 weights, w = d·q + m) is exactly this with scale = d and zero = m + 8·d; Q4_0
  (w = d·(q − 8)) has zero = 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

INT4_GROUP = 32

# Resolved once: looking an op up through `torch.ops.aten` costs microseconds per call, and a
# decode step makes ~120 of these calls.
_INT8_MM = torch.ops.aten._weight_int8pack_mm.default
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


class DenseLinear:
    """y = x·Wᵀ (+ b). weight: (N, K) in the compute dtype."""

    kind = "dense"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight} | ({"bias": self.bias} if self.bias is not None else {})


class Int8Linear:
    """Weight-only int8 with per-output-channel scales; x: (..., K) bf16 -> (..., N) bf16."""

    kind = "int8"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.qweight = qweight  # (N, K) int8
        self.scales = scales  # (N,) bf16
        self.bias = bias
        self.out_features, self.in_features = qweight.shape

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8Linear":
        """Symmetric per-channel quantization: s = max|w_row| / 127, q = round(w / s).

        The kernel takes bf16 scales, so s is rounded up to bf16 first and q computed against
        the rounded scale: every weight is then within half a step of its dequantized value.
        """
        weight = weight.float()
        exact = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        scales = exact.to(torch.bfloat16)
        scales = torch.where(scales.float() < exact, torch.nextafter(scales, torch.tensor(float("inf"), dtype=torch.bfloat16)), scales)
        qweight = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(qweight, scales, None if bias is None else bias.to(torch.bfloat16))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            y = _INT8_MM(x, self.qweight, self.scales)
        else:
            y = _INT8_MM(x.reshape(-1, self.in_features), self.qweight, self.scales)
            y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def state(self) -> dict[str, torch.Tensor]:
        out = {"qweight": self.qweight, "scales": self.scales}
        return out | ({"bias": self.bias} if self.bias is not None else {})


class Int4Linear:
    """Weight-only int4, group-wise scale and zero; x: (..., K) bf16 -> (..., N) bf16."""

    kind = "int4"
    stored = ""  # the checkpoint format(s) the weight was converted from, e.g. "Q5_0" (set by the loader)

    def __init__(
        self,
        packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        in_features: int,
        bias: torch.Tensor | None = None,
        group_size: int = INT4_GROUP,
    ) -> None:
        self.packed = packed  # kernel layout, uint8
        self.scales_and_zeros = scales_and_zeros  # (K/g, N, 2) bf16
        self.group_size = group_size
        self.in_features = in_features
        self.out_features = scales_and_zeros.shape[1]
        self.bias = bias

    @staticmethod
    def supports(out_features: int, in_features: int, group_size: int = INT4_GROUP) -> bool:
        """The CPU kernel needs N divisible by 16 and K by the group size (and by 2)."""
        return out_features % 16 == 0 and in_features % group_size == 0

    @classmethod
    def from_codes(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        bias: torch.Tensor | None = None,
        group_size: int = INT4_GROUP,
    ) -> "Int4Linear":
        """codes: (N, K) ints in [0, 15]; scales, zeros: (N, K/g); w = (q − 8)·scale + zero."""
        n, k = codes.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
        scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
        return cls(packed, scales_and_zeros, k, None if bias is None else bias.to(torch.bfloat16), group_size)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = INT4_GROUP) -> "Int4Linear":
        """Asymmetric min/max quantization per group of `group_size` input features."""
        weight = weight.float()
        n, k = weight.shape
        groups = weight.view(n, k // group_size, group_size)
        low = groups.amin(dim=-1)
        high = groups.amax(dim=-1)
        scales = ((high - low) / 15.0).clamp(min=1e-12)
        codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).view(n, k)
        return cls.from_codes(codes, scales, low + 8.0 * scales, bias, group_size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            y = _INT4_MM(x, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = _INT4_MM(x.reshape(-1, self.in_features), self.packed, self.group_size, self.scales_and_zeros)
            y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantize(self) -> torch.Tensor:
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return self(eye).float().t()  # (N, K): multiply the identity through the kernel

    def state(self) -> dict[str, torch.Tensor]:
        out = {"packed": self.packed, "scales_and_zeros": self.scales_and_zeros}
        return out | ({"bias": self.bias} if self.bias is not None else {})
