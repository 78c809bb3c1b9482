r"""Block verification: Sun et al. 2024, "Block Verification Accelerates Speculative Decoding".

Instead of stopping at the first failed token it keeps a running ratio over the block,

$$
p_0 = 1, \qquad p_i = \min\Big(p_{i-1} \cdot \frac{q[i-1](x_i)}{p[i-1](x_i)},\ 1\Big) \qquad \text{(row } i-1 \text{ produced } x_i\text{)}
$$

$$
h_\gamma = p_\gamma, \qquad h_i = \frac{S_i}{S_i + 1 - p_i} \quad\text{with}\quad S_i = \sum_x \max\big(p_i \cdot q[i](x) - p[i](x),\ 0\big) \tag{4}
$$

(the scalar $p_i$ is the running ratio, the vectors p[i], q[i] are the drafter's and the target's
distributions at draft position i), draws $\eta_i \sim U(0, 1)$ for every i (the loop "continues"
on failure) and accepts τ = the last i with $\eta_i \le h_i$ (0 if none). The next token comes from
the block residual

$$
\operatorname{norm}\big(\max(0,\ p_\tau \cdot q[\tau] - p[\tau])\big) \text{ for } \tau < \gamma, \qquad q[\gamma] \text{ for } \tau = \gamma.
$$

Same output distribution as token verification, never fewer expected accepted tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metagen.speculative.verify import check_inputs, sample_residual, unbatch


def block_verify(
    draft: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Accept the longest prefix chosen by block verification, then sample one token.

    draft: (γ,) / (B, γ) Long; p: (γ, V) / (B, γ, V); q: (γ+1, V) / (B, γ+1, V).
    Returns tau: () / (B,) in [0, γ] and token: () / (B,).

    Edge cases. When p_i = 1 the denominator of (4) reduces to S_i, and h_i = 1 (also for
    S_i = 0: a prefix whose ratio never dropped below 1 is always kept). The block residual at τ
    has zero mass iff p_τ·q[τ] ≤ p[τ] everywhere; for τ ≥ 1 with p_τ < 1 that makes S_τ = 0 and
    h_τ = 0, so τ is never chosen (η < h is strict), and for τ = 0 or p_τ = 1 it means
    q[τ] = p[τ], which forces p_{τ+1} = 1 and h_{τ+1} = 1, so τ is never the last acceptance.
    Hence a zero residual is reached with probability zero; q[τ] is sampled instead only as a
    guard against float rounding or drafts not drawn from p.
    Time complexity: O(B·γ·V); a Python loop over γ only for the clipped running product.
    """
    draft, p, q, batched = check_inputs(draft, p, q)
    batch, gamma = draft.shape
    vocab = q.shape[-1]
    index = draft.unsqueeze(-1)  # (B, γ, 1)
    p_draft = p.gather(-1, index).squeeze(-1).to(q.dtype)  # (B, γ)
    q_draft = q[:, :gamma].gather(-1, index).squeeze(-1)  # (B, γ)
    # q/p with p(x) = 0: an impossible draft; ratio +inf if q(x) > 0 (clipped to 1), else 0.
    tiny = torch.finfo(q.dtype).tiny
    impossible = (q_draft > 0).to(q.dtype) * torch.inf
    ratio = torch.where(p_draft > 0, q_draft / p_draft.clamp(min=tiny), impossible)  # (B, γ)
    running = [q.new_ones(batch)]  # p_0 = 1
    one = q.new_ones(())
    for i in range(gamma):
        # p_i = min(p_{i−1}·ratio_i, 1); 0·inf (a zero ratio already, then an impossible draft) is 0
        running.append(torch.minimum(running[-1] * ratio[:, i], one).nan_to_num(0.0))
    running_ratio = torch.stack(running, dim=1)  # (B, γ+1): p_0 .. p_γ
    # Block residual masses S_i = Σ max(0, p_i·q[i] − p[i]) for i < γ (h_γ needs none).
    mass = (running_ratio[:, :gamma, None] * q[:, :gamma] - p.to(q.dtype)).clamp_(min=0).sum(-1)  # (B, γ)
    ratios = running_ratio[:, 1:]  # p_1 .. p_γ
    # (4): h_i = S_i / (S_i + 1 − p_i), and h_i = 1 when p_i = 1 (the 1 − p_i term vanishes)
    masses = torch.cat([mass[:, 1:], mass.new_zeros(batch, 1)], dim=1)  # S_1 .. S_{γ−1}, (S_γ unused)
    h = torch.where(ratios >= 1, torch.ones_like(ratios), masses / (masses + 1 - ratios).clamp(min=tiny))
    h[:, gamma - 1 :] = ratios[:, gamma - 1 :]  # h_γ = p_γ
    eta = torch.rand(batch, gamma, generator=generator, device=q.device)  # η_1..η_γ
    passed = eta < h  # (B, γ)
    positions = torch.arange(1, gamma + 1, device=q.device)
    # τ = the last i with η_i < h_i (0 if none): failures do not stop the scan
    tau = (passed.long() * positions).amax(-1) if gamma else draft.new_zeros(batch)
    # the residual at τ only: max(0, p_τ·q[τ] − p[τ]), with p[γ] = 0 (then ∝ q[γ])
    rows = tau.view(batch, 1, 1).expand(batch, 1, vocab)
    q_row = q.gather(1, rows).squeeze(1)  # (B, V)
    p_padded = torch.cat([p.to(q.dtype), q.new_zeros(batch, 1, vocab)], dim=1)  # (B, γ+1, V)
    p_row = p_padded.gather(1, rows).squeeze(1)
    residual = (running_ratio.gather(1, tau.view(batch, 1)) * q_row - p_row).clamp_(min=0)
    token = sample_residual(residual, q_row, generator)
    return unbatch(tau, token, batched)
