r"""Token verification (speculative sampling): Leviathan et al. 2023, Chen et al. 2023.

Draft token $x_{i+1} \sim p_i$ is accepted with probability $\min(1, q_i(x)/p_i(x))$, one token
at a time, stopping at the first rejection τ; the next token is drawn from the residual
$\operatorname{norm}(\max(0, q_\tau - p_\tau))$, or from $q_\gamma$ when all γ are accepted.
Each emitted token then follows q exactly (token-level maximal coupling:
$P(\text{accept}) = 1 - \mathrm{TV}(p, q)$). Here $p_i$ = p[i] is the drafter's and $q_i$ = q[i]
the target's distribution at draft position i.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metagen.speculative.verify import check_inputs, sample_residual, unbatch


def token_verify(
    draft: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Accept the longest prefix passing u_i ≤ min(1, q_i(x_i)/p_i(x_i)), then sample one token.

    draft: (γ,) / (B, γ) Long; p: (γ, V) / (B, γ, V); q: (γ+1, V) / (B, γ+1, V).
    Returns tau: () / (B,) in [0, γ] and token: () / (B,).
    Residual: norm(max(0, q[τ] − p[τ])) for τ < γ, q[γ] for τ = γ. The residual has zero mass only
    when q[τ] ≤ p[τ] everywhere, i.e. q[τ] = p[τ]; then every draft token with p(x) > 0 is accepted,
    so a rejection there cannot happen for drafts drawn from p (q[τ] is used as a float guard).
    Time complexity: O(B·γ·V) (one pass over the rows; no Python loop over positions).
    """
    draft, p, q, batched = check_inputs(draft, p, q)
    batch, gamma = draft.shape
    index = draft.unsqueeze(-1)  # (B, γ, 1)
    p_draft = p.gather(-1, index).squeeze(-1)  # (B, γ)
    q_draft = q[:, :gamma].gather(-1, index).squeeze(-1)  # (B, γ)
    u = torch.rand(batch, gamma, generator=generator, device=q.device)  # (B, γ) in [0, 1)
    # u < q/p written without division: p(x) = 0 < q(x) accepts, p(x) = q(x) = 0 rejects.
    accepted = (u * p_draft < q_draft).long()
    tau = accepted.cumprod(-1).sum(-1)  # (B,) length of the accepted prefix
    # A zero row after p makes τ = γ fall out of the same formula: max(0, q[γ] − 0) = q[γ].
    p_padded = torch.cat([p, p.new_zeros(batch, 1, p.shape[-1])], dim=1)  # (B, γ+1, V)
    rows = tau.view(batch, 1, 1).expand(batch, 1, q.shape[-1])
    q_row = q.gather(1, rows).squeeze(1)  # (B, V)
    p_row = p_padded.gather(1, rows).squeeze(1).to(q_row.dtype)  # (B, V)
    token = sample_residual((q_row - p_row).clamp(min=0), q_row, generator)
    return unbatch(tau, token, batched)
