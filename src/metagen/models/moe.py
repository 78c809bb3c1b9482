"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral, Qwen2-MoE): a router picks k of E SwiGLU experts
per token.

    p = softmax(h·W_gᵀ)                       over the E experts, float32   (Shazeer et al. 2017)
    S = top-k(p),  w_e = p_e / Σ_{j∈S} p_j     (renormalised when `normalize`, else w_e = p_e)
    y = Σ_{e∈S} w_e · Down_e(SiLU(Gate_e h) ⊙ Up_e h)                    (Jiang et al. 2024)

Qwen2-MoE adds a shared expert every token runs, gated by a sigmoid:
    y += σ(h·w_s) · Down_s(SiLU(Gate_s h) ⊙ Up_s h)

The order (softmax over all E, then top-k, then renormalise) is transformers' Qwen3MoeTopKRouter /
MixtralTopKRouter; Mixtral always renormalises, Qwen3-MoE when `norm_topk_prob`. The router runs
in float32 whatever the experts' format (a routing decision is discrete: a bf16 rounding could
flip it), as llama.cpp keeps `ffn_gate_inp` unquantized.

Tokens are grouped by expert: the N·k (token, expert) assignments are sorted by expert, and each
expert that received any token runs once over all its tokens (index_select, two matmuls,
index_add), never once per token. Cost: N·E·H for the router plus k·N·3·H·I for the experts, and
at most E expert calls per layer (one host sync for the per-expert counts). Measured on one MoE
layer (H 1024, I 512, E 32, k 4, one thread, best of 5 on a loaded machine), grouped against token
by token: 64 tokens int8 50 vs 179 ms, int4 33 vs 81; 16 tokens 23 vs 42 and 13 vs 21; one token
equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing. router_logits: (N, E) -> (weights (N, k) float32, experts (N, k) int64),
    experts in decreasing probability; weights renormalised to sum to 1 when `normalize`."""
    probs = torch.softmax(router_logits.float(), dim=-1)  # (N, E)
    weights, experts = torch.topk(probs, top_k, dim=-1)  # (N, k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def moe_mlp(layer, h: torch.Tensor, top_k: int, normalize: bool) -> torch.Tensor:
    """The mixture-of-experts MLP on `h (..., H)` (matmul dtype) -> `(..., H)` float32.

    layer: has `router` (H -> E, float32), `expert_gate_up` (E linears H -> 2·I) and
    `expert_down` (E linears I -> H) in any format of `models/linear.py`; a shared expert is
    `gate_up` / `down` with `shared_expert_gate` (H -> 1, float32), or None.
    """
    flat = h.reshape(-1, h.shape[-1])  # (N, H)
    weights, experts = route(layer.router(flat.float()), top_k, normalize)  # (N, k) each
    assignments = experts.reshape(-1)  # (N·k,): token n's j-th expert at n·k + j
    order = torch.argsort(assignments, stable=True)  # assignments grouped by expert
    per_expert = torch.bincount(assignments, minlength=len(layer.expert_down)).tolist()
    scale = weights.reshape(-1, 1)  # (N·k, 1)
    out = torch.zeros(flat.shape, dtype=torch.float32)  # (N, H)
    start = 0
    for expert, count in enumerate(per_expert):
        if count == 0:
            continue
        chosen = order[start : start + count]  # the assignments routed to `expert`
        start += count
        tokens = chosen // top_k  # (n_e,)
        gate, up = layer.expert_gate_up[expert](flat.index_select(0, tokens)).chunk(2, dim=-1)
        y = layer.expert_down[expert](F.silu(gate) * up)  # (n_e, H)
        out.index_add_(0, tokens, y.float() * scale.index_select(0, chosen))
    if layer.gate_up is not None:  # the shared expert (Qwen2-MoE), on every token
        gate, up = layer.gate_up(flat).chunk(2, dim=-1)
        out += torch.sigmoid(layer.shared_expert_gate(flat.float())) * layer.down(F.silu(gate) * up).float()
    return out.view(*h.shape[:-1], h.shape[-1])
