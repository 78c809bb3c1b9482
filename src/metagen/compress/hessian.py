"""The layer-wise Hessian every second-order method here shares.

For one linear layer with weight W (N, K) and calibration inputs X (K, n), the layer-wise loss
‖W X − Ŵ X‖² (Hassibi et al. 1993's OBS applied layer by layer, as in Frantar & Alistarh 2022) is
a quadratic in each row of Ŵ with Hessian H = 2 X Xᵀ (K, K), the same for every row. It is
accumulated as a running mean over calibration tokens (the scale does not change any update,
which divides by entries of H⁻¹, nor the dampening, which is relative to mean diag H).

Dampening: H + λ·mean(diag H)·I (λ = `damp`, 0.01 in GPTQ) keeps H invertible when calibration
is short or inputs are correlated. An input feature that never fires (H_kk = 0) gets H_kk = 1 and
its weights set to 0, since they never touch the output.
"""

from __future__ import annotations

import torch


class HessianAccumulator:
    """Running H = (2/n) Σ_t x_t x_tᵀ over calibration inputs; `add(x)` with x (..., K)."""

    def __init__(self, features: int) -> None:
        self.hessian = torch.zeros(features, features, dtype=torch.float64)
        self.count = 0

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.reshape(-1, inputs.shape[-1]).double()  # (n, K)
        n = x.shape[0]
        total = self.count + n
        self.hessian *= self.count / total
        self.hessian += (2.0 / total) * (x.t() @ x)
        self.count = total


def check_damp(damp: float) -> None:
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not 0.0 <= damp < 1.0:
        raise ValueError(f"damp={damp!r} is out of range: must be a number in [0, 1)")


def prepare(weight: torch.Tensor, hessian: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (N, K) float32 copy with dead columns zeroed, dampened H (K, K) float64)."""
    check_damp(damp)
    k = weight.shape[1]
    if hessian.shape != (k, k):
        raise ValueError(f"hessian has shape {tuple(hessian.shape)}, expected ({k}, {k}) for a weight with {k} inputs")
    weight = weight.float().clone()
    hessian = hessian.double().clone()
    dead = hessian.diagonal() == 0
    hessian[dead, dead] = 1.0
    weight[:, dead] = 0.0
    hessian.diagonal().add_(damp * hessian.diagonal().mean())
    return weight, hessian


def layer_error(weight: torch.Tensor, compressed: torch.Tensor, inputs: torch.Tensor) -> float:
    """‖W X − Ŵ X‖²_F for inputs X given as rows (n, K)."""
    return float(((weight.double() - compressed.double()) @ inputs.double().t()).square().sum())
