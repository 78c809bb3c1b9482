"""Post-training quantization on a uniform grid, with the clipping range chosen per group.

Standard post-training quantization: clip the outliers, then quantize every value to
equally spaced bins. A grid of `maxq + 1` levels per group of `group_size` input features is

    value(q) = (q − center) · scale + zero,     q ∈ {0, …, maxq}

which is the int4 kernel's layout (`models/linear.py`: center 8, w = (q − 8)·scale + zero) and,
with center = 127 and zero = 0, the symmetric int8 one. Quantizing is
q = clamp(⌊(w − zero)/scale + center + ½⌋, 0, maxq): rounding half up
(0.5 on the grid {−2, −1, 0, 1, 2} becomes 1).

Clipping: the grid spans [α·low, α·high] where [low, high] is the group's range (widened to hold
0), and α is picked per group from `clip_steps` candidates in [min_clip, 1] to minimise the
squared quantization error Σ (value(q(w)) − w)² — a narrower range gives up the outliers for finer
steps everywhere else (the search of Frantar et al. 2023's GPTQ code and of Lin et al. 2024's AWQ).
α = 1 only is plain round-to-nearest (RTN) over the min/max range.

Scales and zeros are rounded to bfloat16 before any value is quantized, because the kernels store
them so: the grid used here is exactly the one the compressed model runs.

Cost: O(N·K·clip_steps) for an (N, K) weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS = (3, 4, 8)


def round_half_up(x: torch.Tensor) -> torch.Tensor:
    """⌊x + ½⌋: rounding half up (torch.round rounds half to even)."""
    return torch.floor(x + 0.5)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@dataclass(frozen=True)
class Grid:
    """A uniform grid per (row, group): scale, zero (N, K/g) float32 holding bf16 values.

    value(q) = (q − center)·scale + zero, q ∈ {0, …, maxq}; column k belongs to group k // group_size.
    """

    scale: torch.Tensor  # (N, G)
    zero: torch.Tensor  # (N, G)
    maxq: int
    center: int
    group_size: int

    def codes(self, weight: torch.Tensor, columns: slice | None = None) -> torch.Tensor:
        """Codes (N, C) in [0, maxq] (float32 holding integers) of `weight (N, C)` = the grid's
        columns `columns` (default all)."""
        scale, zero = self._expand(weight.shape[1], columns)
        return round_half_up((weight - zero) / scale + self.center).clamp(0, self.maxq)

    def dequantize(self, codes: torch.Tensor, columns: slice | None = None) -> torch.Tensor:
        scale, zero = self._expand(codes.shape[1], columns)
        return (codes - self.center) * scale + zero

    def quantize(self, weight: torch.Tensor, columns: slice | None = None) -> torch.Tensor:
        """The nearest grid value of each weight (ties up), (N, C) float32."""
        return self.dequantize(self.codes(weight, columns), columns)

    def _expand(self, width: int, columns: slice | None) -> tuple[torch.Tensor, torch.Tensor]:
        start = 0 if columns is None else columns.start
        groups = torch.arange(start, start + width) // self.group_size
        return self.scale[:, groups], self.zero[:, groups]


def check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits={bits!r} is not supported: choose one of {', '.join(map(str, BITS))}")


def clip_quantize(values: torch.Tensor, low: float, high: float, levels: int) -> torch.Tensor:
    """Clip-then-round on one tensor: clip to [low, high], then round to the nearest of
    `levels` equally spaced values from low to high (ties up)."""
    if levels < 2 or not low < high:
        raise ValueError(f"need levels >= 2 and low < high, got levels={levels}, low={low}, high={high}")
    step = (high - low) / (levels - 1)
    codes = round_half_up((values.clamp(low, high) - low) / step).clamp(0, levels - 1)
    return codes * step + low


def fit_grid(weight: torch.Tensor, bits: int, group_size: int, *, clip: bool = True, clip_steps: int = 20,
             min_clip: float = 0.5) -> Grid:
    """The grid for `weight (N, K)`: per (row, group of `group_size` columns), asymmetric for
    3 and 4 bits (int4 layout, center 8), symmetric per row for 8 bits (int8 layout; the int8
    kernel has one scale per output channel, so group_size must equal K). With `clip`, the
    range is shrunk by the α in [min_clip, 1] (clip_steps values) of least squared error.
    """
    check_bits(bits)
    weight = weight.float()
    n, k = weight.shape
    if bits == 8 and group_size != k:
        raise ValueError(f"group_size={group_size} is not supported with bits=8: the int8 format has one scale "
                         f"per output channel, so group_size must be the input width {k}")
    if group_size < 1 or k % group_size:
        raise ValueError(f"group_size={group_size} must divide the input width {k}")
    if clip_steps < 1 or not 0.0 < min_clip <= 1.0:
        raise ValueError(f"clip_steps={clip_steps} must be >= 1 and min_clip={min_clip} in (0, 1]")
    groups = weight.view(n, k // group_size, group_size)
    alphas = torch.linspace(1.0, min_clip, clip_steps) if clip else torch.ones(1)
    best_error = torch.full(groups.shape[:2], float("inf"))
    best_scale = torch.zeros(groups.shape[:2])
    best_zero = torch.zeros(groups.shape[:2])
    for alpha in alphas.tolist():
        scale, zero, maxq, center = _range_grid(groups, bits, alpha)
        codes = round_half_up((groups - zero[..., None]) / scale[..., None] + center).clamp(0, maxq)
        error = ((codes - center) * scale[..., None] + zero[..., None] - groups).square().sum(-1)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
    maxq, center = (254, 127) if bits == 8 else (2**bits - 1, 8)
    return Grid(best_scale, best_zero, maxq, center, group_size)


def _range_grid(groups: torch.Tensor, bits: int, alpha: float):
    """scale, zero (N, G) of the grid spanning α·[low, high] of each group (bf16-rounded)."""
    if bits == 8:
        high = groups.abs().amax(dim=-1) * alpha
        scale = _round_up_bf16((high / 127.0).clamp(min=1e-12))
        return scale, torch.zeros_like(scale), 254, 127
    maxq = 2**bits - 1
    low = groups.amin(dim=-1).clamp(max=0.0) * alpha
    high = groups.amax(dim=-1).clamp(min=0.0) * alpha
    scale = _bf16(((high - low) / maxq).clamp(min=1e-8))
    zero = _bf16(low + 8.0 * scale)  # code 0 sits at `low`
    return scale, zero, maxq, 8


def _round_up_bf16(x: torch.Tensor) -> torch.Tensor:
    """Smallest bf16 value >= x, so the symmetric grid still reaches ±α·max|w|."""
    rounded = x.to(torch.bfloat16)
    up = torch.nextafter(rounded, torch.tensor(float("inf"), dtype=torch.bfloat16))
    return torch.where(rounded.float() < x, up, rounded).float()


def quantize_rtn(weight: torch.Tensor, bits: int, group_size: int, *, clip: bool = False) -> tuple[torch.Tensor, Grid]:
    """Round every weight to its grid (no error compensation): (dequantized (N, K), grid)."""
    grid = fit_grid(weight, bits, group_size, clip=clip)
    return grid.quantize(weight.float()), grid
