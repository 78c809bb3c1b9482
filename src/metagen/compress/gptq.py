"""GPTQ (Frantar, Ashkboos, Hoefler & Alistarh 2023): OBC's quantization made fast.

OBC quantizes one row at a time in the greedy order its loop picks, each row with its own H⁻¹.
GPTQ quantizes every row in the same, fixed column order 0..K−1, so all rows share one H⁻¹ and
its sequence of downdates, which is the Cholesky factor: with H⁻¹ = Uᵀ U (U upper triangular),
row j of U is the j-th downdated H⁻¹ row scaled by 1/√[H⁻¹]_jj. Column j is then

    q_j = quant(w_j),   e_j = (w_j − q_j) / U_jj,   w_{j+1:} ← w_{j+1:} − e_j · U_{j, j+1:}

(OBS's update w ← w − H⁻¹_{:,p} (w_p − q(w_p)) / [H⁻¹]_pp, written with U). Lazy blocks: the
update of columns beyond the current block of B columns is deferred and applied once per block
as a matrix product W_{:, i2:} −= E · U_{i1:i2, i2:}, which turns K rank-one updates of the
whole matrix into K/B matmuls. Dampening H + λ·mean(diag H)·I (λ = 0.01) keeps the Cholesky
factorisation stable.

Group-wise grids (`quantize.Grid`) are fitted when the sweep reaches a group's first column,
on the weights as updated so far (optionally with the clipping search). The same sweep with a
mask rule is SparseGPT (`sparsegpt.py`): pruned weights are "quantized" to 0, and the two
combine (prune and quantize in one pass).

Cost: O(K³) for the Cholesky factors, O(N·K²) for the sweep, memory O(K² + N·K).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from metagen.compress.hessian import prepare
from metagen.compress.quantize import Grid, check_bits, fit_grid

# (block weights (N, B), diag(U) of the block (B,), column offset j inside the block) -> the block's
# prune mask (N, B) bool, or None to keep it; called at j = 0 and (for N:M) every M columns.
MaskRule = Callable[[torch.Tensor, torch.Tensor, int], "torch.Tensor | None"]


@dataclass(frozen=True)
class SweepResult:
    """The compressed weight (N, K) float32 (pruned entries exactly 0), its grid (None when not
    quantized) and its prune mask (N, K) bool (None when not pruned)."""

    weight: torch.Tensor
    grid: Grid | None
    mask: torch.Tensor | None


def inverse_cholesky(hessian: torch.Tensor) -> torch.Tensor:
    """U upper triangular with H⁻¹ = Uᵀ U, float32 (K, K); H must be positive definite."""
    try:
        factor = torch.linalg.cholesky(hessian)
        return torch.linalg.cholesky(torch.cholesky_inverse(factor), upper=True).float()
    except torch.linalg.LinAlgError as error:
        raise ValueError(f"the layer's Hessian is not positive definite ({error}); raise damp") from None


def gptq(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int, *, clip: bool = False,
         block_size: int = 128, damp: float = 0.01) -> SweepResult:
    """Quantize `weight (N, K)` to `bits` with group-wise grids, minimising ‖WX − ŴX‖²."""
    check_bits(bits)
    return sweep(weight, hessian, bits=bits, group_size=group_size, clip=clip, block_size=block_size, damp=damp)


def sweep(weight: torch.Tensor, hessian: torch.Tensor, *, bits: int | None = None, group_size: int | None = None,
          clip: bool = False, mask_rule: MaskRule | None = None, mask_every: int | None = None,
          block_size: int = 128, damp: float = 0.01) -> SweepResult:
    """The fixed-order OBS sweep shared by GPTQ and SparseGPT (see the module docstring).

    bits / group_size: quantize onto group-wise grids (None: no quantization). mask_rule:
    choose pruned weights at the start of each block and, when mask_every is set, every
    mask_every columns inside it (N:M)."""
    n, k = weight.shape
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int")
    if mask_every is not None and block_size % mask_every:
        raise ValueError(f"block_size={block_size} must be a multiple of M={mask_every}")
    if bits is not None:
        check_bits(bits)
        if group_size is None or group_size < 1 or k % group_size:
            raise ValueError(f"group_size={group_size!r} must divide the input width {k}")
    w, h = prepare(weight, hessian, damp)
    u = inverse_cholesky(h)
    scales, zeros = [], []
    full_mask = torch.zeros(n, k, dtype=torch.bool) if mask_rule is not None else None
    with _one_thread():
        last = _columns(w, u, bits, group_size, clip, mask_rule, mask_every, block_size, scales, zeros, full_mask)
    grid = None
    if bits is not None:
        grid = Grid(torch.cat(scales, dim=1), torch.cat(zeros, dim=1), last.maxq, last.center, group_size)
    return SweepResult(w, grid, full_mask)


@contextmanager
def _one_thread():
    """The column loop is thousands of small ops: with several intra-op threads each waits at
    an OpenMP barrier, which on a busy machine (threads descheduled) made a (3072, 576) sweep
    14-35x slower than on one thread (measured: SparseGPT 75 s vs 5.5 s, GPTQ 126 s vs 3.6 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _columns(w, u, bits, group_size, clip, mask_rule, mask_every, block_size, scales, zeros,
             full_mask) -> Grid | None:
    """The sweep itself: updates w (N, K) in place, appends each group's scale and zero, returns
    the last group's grid (None without quantization)."""
    n, k = w.shape
    grid_now = None  # the current group's grid
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        block = w[:, i1:i2].clone()  # (N, B) updated in place column by column
        errors = torch.zeros_like(block)
        u_block = u[i1:i2, i1:i2]
        diag = u_block.diagonal()
        mask = None
        for j in range(i2 - i1):
            column = i1 + j
            if mask_rule is not None and (j == 0 or (mask_every is not None and j % mask_every == 0)):
                chosen = mask_rule(block[:, j:], diag[j:], j)
                if chosen is not None:
                    mask = torch.zeros_like(block, dtype=torch.bool) if mask is None else mask
                    mask[:, j:j + chosen.shape[1]] = chosen
            if bits is not None and column % group_size == 0:
                # the group's current weights: this block's updated columns, then the rest
                group = torch.cat((block[:, j:], w[:, i2:]), dim=1)[:, :group_size]
                grid = fit_grid(group, bits, group_size, clip=clip)
                scales.append(grid.scale)
                zeros.append(grid.zero)
                grid_now = grid
            current = block[:, j]
            target = current.clone()
            if bits is not None:
                target = grid_now.quantize(current[:, None])[:, 0]
            if mask is not None:
                target = target.masked_fill(mask[:, j], 0.0)
            error = (current - target) / diag[j]
            block[:, j:] -= error[:, None] * u_block[j, j:][None, :]
            block[:, j] = target  # exact: the update leaves w_j = target up to rounding
            errors[:, j] = error
        w[:, i1:i2] = block
        w[:, i2:] -= errors @ u[i1:i2, i2:]  # the deferred update of every later column
        if mask is not None:
            full_mask[:, i1:i2] = mask
    return grid_now
