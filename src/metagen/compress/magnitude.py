"""Magnitude pruning: drop the weights closest to zero (magnitude-based pruning).

- Unstructured: zero the ⌊s·N·K⌋ weights of least |w| in the whole (N, K) matrix (ties broken by
  position), i.e. the layer-wise magnitude baseline of Frantar & Alistarh 2023 (SparseGPT, their
  Table: OPT at 50% goes from ~12 to hundreds or thousands of perplexity).
- N:M structured (Mishra et al. 2021, "2:4" on Ampere tensor cores): in every run of M consecutive
  input features of a row keep the N of largest |w|; exactly N nonzeros per M (when the weights
  kept are nonzero).

Masks are boolean (True = pruned). O(N·K log(N·K)) unstructured, O(N·K) for N:M.
"""

from __future__ import annotations

import torch


def check_sparsity(sparsity: float) -> None:
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity!r} is out of range: must be a number in [0, 1)")


def check_n_m(n: int, m: int) -> None:
    if not (isinstance(n, int) and isinstance(m, int)) or not 0 < n < m:
        raise ValueError(f"N:M = {n!r}:{m!r} is not supported: need integers 0 < N < M (e.g. 2:4)")


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """(N, K) bool, True where pruned: the ⌊sparsity·N·K⌋ entries of least |w| (ties by position)."""
    check_sparsity(sparsity)
    count = int(sparsity * weight.numel())
    mask = torch.zeros(weight.numel(), dtype=torch.bool)
    if count:
        order = torch.sort(weight.abs().flatten(), stable=True).indices
        mask[order[:count]] = True
    return mask.view_as(weight)


def n_m_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """(N, K) bool, True where pruned: in each row's consecutive groups of m columns, all but the
    n of largest score. scores: (N, K) with K divisible by m (|w| for magnitude pruning)."""
    check_n_m(n, m)
    rows, k = scores.shape
    if k % m:
        raise ValueError(f"the input width {k} is not a multiple of M={m}")
    groups = scores.reshape(rows, k // m, m)
    keep = torch.topk(groups, n, dim=-1).indices
    mask = torch.ones_like(groups, dtype=torch.bool)
    mask.scatter_(-1, keep, False)
    return mask.view(rows, k)


def prune_magnitude(weight: torch.Tensor, sparsity: float = 0.0, n_m: tuple[int, int] | None = None) -> torch.Tensor:
    """The weight with its smallest-magnitude entries zeroed: unstructured to `sparsity`, or N:M."""
    if n_m is not None:
        mask = n_m_mask(weight.abs(), *n_m)
    else:
        mask = magnitude_mask(weight, sparsity)
    return weight.masked_fill(mask, 0.0)
