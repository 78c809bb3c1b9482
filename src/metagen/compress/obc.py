"""Optimal brain surgeon and optimal brain compression, by their defining loops.

OBS (Hassibi et al. 1993): around a minimum w* of a loss with Hessian H, removing coordinate p
at least cost solves min (w − w*)ᵀ H (w − w*) s.t. w_p = 0, whose solution is

    p = argmin_p w_p² / [H⁻¹]_pp,     w ← w − H⁻¹_{:,p} · w_p / [H⁻¹]_pp,

and with H = I this is magnitude pruning. OBC (Frantar & Alistarh 2022) applies it greedily,
one row of a layer at a time, with the layer-wise loss ‖W X − Ŵ X‖² (H = 2XXᵀ, `hessian.py`),
removing p from the problem after each step by the rank-one downdate

    H⁻¹ ← H⁻¹ − H⁻¹_{:,p} H⁻¹_{p,:} / [H⁻¹]_pp

(the inverse of H with row and column p removed). Quantization is the same loop with
p = argmin (q(w_p) − w_p)² / [H⁻¹]_pp and w ← w − H⁻¹_{:,p} (w_p − q(w_p)) / [H⁻¹]_pp, which
leaves w_p = q(w_p); every column is quantized, in the order the loop picks.

Each step is the exact constrained optimum of the quadratic, so after k steps w is the best
weight with the k chosen coordinates fixed (tested against brute force). Rows are independent
and run batched, each with its own H⁻¹ (R, K, K). Cost: O(N·k·K²) time for k steps on an
(N, K) weight, O(rows_per_batch·K²) memory (≤ 256 MiB by default); the downdate sweeps the
inverses once per step, in place. Still far too slow for a whole model's linears (a K = 576
projection takes ~0.05 s per step per 101 rows, K steps per row): `benchmarks/compression.py
--layer-error` measures it on a subset.
"""

from __future__ import annotations

import torch

from metagen.compress.hessian import prepare
from metagen.compress.quantize import Grid


# float64 entries of the per-row inverses held at once (2^25: 256 MiB), which sets the rows per batch
_BATCH_ENTRIES = 1 << 25


def obc_prune(weight: torch.Tensor, hessian: torch.Tensor, count: int, *, damp: float = 0.0,
              rows_per_batch: int | None = None) -> torch.Tensor:
    """Prune `count` weights of every row of `weight (N, K)` greedily by OBS; returns (N, K)."""
    k = weight.shape[1]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= k:
        raise ValueError(f"count={count!r} is out of range: must be an int in [0, {k}]")
    return _obc(weight, hessian, damp, rows_per_batch, count, None)


def obc_quantize(weight: torch.Tensor, hessian: torch.Tensor, grid: Grid, *, damp: float = 0.0,
                 rows_per_batch: int | None = None) -> torch.Tensor:
    """Quantize every weight of `weight (N, K)` onto `grid`, greedily by OBS; returns (N, K)."""
    return _obc(weight, hessian, damp, rows_per_batch, weight.shape[1], grid)


def _obc(weight, hessian, damp, rows_per_batch, steps, grid: Grid | None) -> torch.Tensor:
    weight, hessian = prepare(weight, hessian, damp)
    inverse = torch.linalg.inv(hessian)  # (K, K) float64
    if rows_per_batch is None:
        rows_per_batch = max(1, _BATCH_ENTRIES // weight.shape[1] ** 2)
    out = weight.clone()
    for start in range(0, weight.shape[0], rows_per_batch):
        rows = slice(start, start + rows_per_batch)
        target = None if grid is None else Grid(grid.scale[rows], grid.zero[rows], grid.maxq, grid.center,
                                                grid.group_size)
        out[rows] = _obc_rows(weight[rows].double(), inverse, steps, target).float()
    return out


def _obc_rows(w: torch.Tensor, inverse: torch.Tensor, steps: int, grid: Grid | None) -> torch.Tensor:
    """The OBS / OBC loop on rows w (R, K) float64, each with its own copy of H⁻¹."""
    r, k = w.shape
    hinv = inverse.expand(r, k, k).clone()  # (R, K, K)
    alive = torch.ones(r, k, dtype=torch.bool)
    index = torch.arange(r)
    for _ in range(steps):
        diag = hinv.diagonal(dim1=1, dim2=2)  # (R, K)
        target = torch.zeros_like(w) if grid is None else grid.quantize(w.float()).double()
        score = (target - w).square() / diag
        score = score.masked_fill(~alive, float("inf"))
        p = score.argmin(dim=1)  # (R,)
        column = hinv[index, :, p]  # (R, K) = H⁻¹_{:,p} per row
        pivot = column[index, p]  # (R,)
        value = target[index, p]
        # fixed coordinates have H⁻¹ rows of exactly 0 in exact arithmetic; keep them exact
        w = w - (column * ((w[index, p] - value) / pivot)[:, None]).masked_fill(~alive, 0.0)
        w[index, p] = value  # exact, rather than w_p − w_p up to rounding
        # in place (one pass over the (R, K, K) inverses, no temporaries): 30x faster than
        # hinv - column ⊗ column / pivot, which allocated and swept three (R, K, K) tensors per step
        hinv.baddbmm_(column[:, :, None], (column / pivot[:, None])[:, None, :], alpha=-1.0)
        alive[index, p] = False
    return w
