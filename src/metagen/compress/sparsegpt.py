"""SparseGPT (Frantar & Alistarh 2023): one-shot pruning with GPTQ's sweep.

The sweep of `gptq.py` (fixed column order, lazy blocks, Cholesky factor U of H⁻¹) with a mask
in place of (or before) the quantizer: a pruned weight's target is 0, so its error
e_j = w_j / U_jj is spread over the later columns by the same OBS update. The mask is chosen
per block of B columns ("adaptive mask selection"), from the OBS saliency at the moment the
block is reached,

    score_ij = w_ij² / U_jj²     (= w² / [H⁻¹]_jj of the downdated inverse, the OBS saliency)

pruning the ⌊s·N·B⌋ lowest scores of the block (unstructured, sparsity s), or for N:M the M − N
lowest of every M consecutive columns of a row, chosen when the sweep reaches that run (so the
run's scores include the updates from every earlier column). With `bits`, kept weights are
quantized in the same pass (sparse + quantized).

Cost: GPTQ's, O(K³ + N·K²), plus a sort of each block's scores.
"""

from __future__ import annotations

import torch

from metagen.compress.gptq import SweepResult, sweep
from metagen.compress.magnitude import check_n_m, check_sparsity, n_m_mask


def sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, *, sparsity: float = 0.0,
              n_m: tuple[int, int] | None = None, bits: int | None = None, group_size: int | None = None,
              clip: bool = False, block_size: int = 128, damp: float = 0.01) -> SweepResult:
    """Prune `weight (N, K)` to `sparsity` (or N:M), optionally quantizing the kept weights."""
    if n_m is not None:
        check_n_m(*n_m)
        keep, run = n_m
        if weight.shape[1] % run:
            raise ValueError(f"the input width {weight.shape[1]} is not a multiple of M={run}")

        def rule(block: torch.Tensor, diag: torch.Tensor, offset: int) -> torch.Tensor:
            scores = block[:, :run].square() / diag[:run].square()[None, :]
            return n_m_mask(scores, keep, run)

        return sweep(weight, hessian, bits=bits, group_size=group_size, clip=clip, mask_rule=rule,
                     mask_every=run, block_size=block_size, damp=damp)
    check_sparsity(sparsity)

    def rule(block: torch.Tensor, diag: torch.Tensor, offset: int) -> torch.Tensor | None:
        if offset:
            return None
        scores = block.square() / diag.square()[None, :]  # (N, B)
        count = int(sparsity * scores.numel())
        mask = torch.zeros(scores.numel(), dtype=torch.bool)
        mask[torch.sort(scores.flatten(), stable=True).indices[:count]] = True
        return mask.view_as(scores)

    return sweep(weight, hessian, bits=bits, group_size=group_size, clip=clip, mask_rule=rule,
                 block_size=block_size, damp=damp)
