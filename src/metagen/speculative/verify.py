"""Shared pieces of the speculative verification rules, and greedy verification.

Every rule takes γ draft tokens and the distributions around them:

    draft: (γ,) or (B, γ)            LongTensor, the draft tokens x_1..x_γ
    p:     (γ, V) or (B, γ, V)       draft distributions; row i produced x_{i+1}
    q:     (γ+1, V) or (B, γ+1, V)   target distributions at the same positions plus one more

(probabilities after the same sampler chain; rows sum to 1) and returns `(tau, token)`:
`tau: ()` / `(B,)` accepted draft tokens and `token: ()` / `(B,)` the one token sampled after them
(the correction from a residual, or the bonus token from q[γ] when all γ are accepted).
Nothing here writes into its inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Rows must sum to 1 within this slack (float32 softmax output of a 150k vocabulary is ~1e-5 off).
ROW_SUM_TOLERANCE = 1e-3


def check_probabilities(name: str, rows: Tensor, expected: str) -> None:
    """Raise ValueError unless `rows` is floating, finite, non-negative and sums to 1 per row."""
    if not rows.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of shape {expected}, got {rows.dtype}")
    if rows.numel() == 0:
        return
    sums = rows.sum(-1, dtype=torch.float64)  # NaN or ±inf anywhere makes its row sum non-finite
    if not bool(torch.isfinite(sums).all()) or float(rows.min()) < 0:
        raise ValueError(f"{name} must hold finite non-negative probabilities (shape {expected})")
    if bool(((sums - 1).abs() > ROW_SUM_TOLERANCE).any()):
        raise ValueError(f"{name} rows must sum to 1 (shape {expected}), got sums {sums.flatten()[:4].tolist()}")


def check_inputs(draft: Tensor, p: Tensor | None, q: Tensor) -> tuple[Tensor, Tensor | None, Tensor, bool]:
    """Validate the shapes above; return `(draft, p, q, batched)` with a leading batch dim added.

    Raises ValueError naming the argument and its expected shape.
    """
    if not isinstance(draft, Tensor) or draft.dtype not in (torch.int64, torch.int32):
        raise ValueError("draft must be an integer (Long) tensor of shape (γ,) or (B, γ)")
    if draft.dim() not in (1, 2):
        raise ValueError(f"draft must have shape (γ,) or (B, γ), got {tuple(draft.shape)}")
    batched = draft.dim() == 2
    if not batched:
        draft = draft.unsqueeze(0)
        q = q.unsqueeze(0) if isinstance(q, Tensor) else q
        p = p.unsqueeze(0) if isinstance(p, Tensor) else p
    batch, gamma = draft.shape
    if not isinstance(q, Tensor) or q.dim() != 3 or q.shape[:2] != (batch, gamma + 1) or q.shape[2] == 0:
        got = tuple(q.shape[1:] if not batched else q.shape) if isinstance(q, Tensor) else type(q).__name__
        raise ValueError(f"q must have shape (γ+1, V) = ({gamma + 1}, V) per row, got {got}")
    vocab = q.shape[2]
    check_probabilities("q", q, "(γ+1, V)")
    if p is not None:
        if not isinstance(p, Tensor) or p.dim() != 3 or p.shape != (batch, gamma, vocab):
            got = tuple(p.shape[1:] if not batched else p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"p must have shape (γ, V) = ({gamma}, {vocab}) per row, got {got}")
        check_probabilities("p", p, "(γ, V)")
    if gamma and (bool((draft < 0).any()) or bool((draft >= vocab).any())):
        raise ValueError(f"draft tokens must lie in [0, V) = [0, {vocab})")
    return draft.long(), p, q, batched


def sample_residual(residual: Tensor, fallback: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row from norm(residual), or from `fallback` where the residual has no mass.

    residual, fallback: (B, V) non-negative → (B,). A residual of zero mass has probability zero
    of being reached in exact arithmetic (see each rule); `fallback` (the target row) only guards
    against float rounding and inconsistent inputs. Drawn by inverse CDF (a float64 cumulative
    sum and one uniform per row): the first index whose cumulative weight exceeds u·total, which
    is never a zero-weight token. O(B·V), several times faster than `torch.multinomial` on a
    150k vocabulary.
    """
    mass = residual.sum(-1, keepdim=True)  # (B, 1)
    weights = torch.where(mass > 0, residual, fallback)
    cdf = weights.double().cumsum(-1)  # (B, V)
    u = torch.rand(weights.shape[0], 1, generator=generator, dtype=torch.float64, device=weights.device)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return token.clamp(max=weights.shape[-1] - 1)


def unbatch(tau: Tensor, token: Tensor, batched: bool) -> tuple[Tensor, Tensor]:
    return (tau, token) if batched else (tau[0], token[0])


def greedy_verify(draft: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """Temperature-0 verification: keep the longest prefix equal to the target argmax.

    draft: (γ,) / (B, γ); q: (γ+1, V) / (B, γ+1, V) (probabilities or logits: only argmax is used,
    ties go to the lowest index as in `torch.argmax`).
    tau = max{t : draft[i] == argmax q[i] for all i < t}; token = argmax q[tau].
    Time complexity: O(γ·V).
    """
    if not isinstance(q, Tensor) or not q.is_floating_point():
        raise ValueError("q must be a floating-point tensor of shape (γ+1, V) or (B, γ+1, V)")
    if not isinstance(draft, Tensor) or draft.dtype not in (torch.int64, torch.int32) or draft.dim() not in (1, 2):
        raise ValueError("draft must be an integer (Long) tensor of shape (γ,) or (B, γ)")
    batched = draft.dim() == 2
    draft2 = draft if batched else draft.unsqueeze(0)
    q3 = q if batched else q.unsqueeze(0)
    batch, gamma = draft2.shape
    if q3.dim() != 3 or q3.shape[:2] != (batch, gamma + 1) or q3.shape[2] == 0:
        raise ValueError(f"q must have shape (γ+1, V) = ({gamma + 1}, V) per row, got {tuple(q.shape)}")
    best = q3.argmax(-1)  # (B, γ+1)
    matches = (draft2.long() == best[:, :gamma]).long()  # (B, γ)
    tau = matches.cumprod(-1).sum(-1)  # (B,)
    token = best.gather(1, tau.unsqueeze(1)).squeeze(1)
    return unbatch(tau, token, batched)
