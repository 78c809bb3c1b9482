"""One pre-norm decoder layer: the body every dense family and both execution paths run.

    x ← x + O(Attention(RoPE(QKNorm(Q, K)), V))   on h = RMSNorm(x)      (Touvron et al. 2023)
    x ← x + Down(SiLU(Gate h) ⊙ Up h)              on h = RMSNorm(x)      (SwiGLU, Shazeer 2020)
                or the top-k mixture of SwiGLU experts of `models/moe.py`  (Qwen3-MoE, Mixtral, Qwen2-MoE)

with RoPE (Su et al. 2021) on interleaved pairs, grouped-query attention (Ainslie et al. 2023),
optional q/k/v bias (Qwen2, inside the fused QKV linear) and optional per-head q/k RMSNorm
before RoPE (Qwen3, Gemma 3). Q·K·V and gate·up run as one fused matmul each. Gemma 3 adds an
RMSNorm of each sublayer's output before its residual add (`attn_post_norm`, `mlp_post_norm`)
and GeGLU, GELU(tanh approximation)(Gate h) ⊙ Up h, for SwiGLU (`config.hidden_activation`).

What differs between the general (prefill) path and the fused decode path is only *how* two
steps run, passed in as `ops`:
- `ops.attend(index, qkv)`: RoPE on q and k, store k and v in the cache, attention; returns
  `(..., heads·D)` in the matmul dtype;
- `ops.add_norm(x, delta, weight)`: `x += delta` (the float32 residual stream) and the next
  RMSNorm of x in the matmul dtype, returning `(x, h)`;
- `ops.gated(gate_up, activation)`: the MLP's act(gate) ⊙ up of `[gate | up]`;
- `ops.buffer(name, linear)`: where `linear`'s output goes: the decode path's reused
  `(N, out_features)` buffer `name` (its layer loop allocates nothing), or None (a fresh tensor).
The layer itself is written once (`decoder_layer`); `Ops` is that contract and
`models/layer_ops.py` holds the two implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol

import torch
import torch.nn.functional as F

from metagen.models.moe import moe_mlp


def _norm(optional: bool = False):
    return field(default=None, metadata={"kind": "norm", "optional": True}) if optional else field(
        metadata={"kind": "norm", "optional": False})


def _linear(optional: bool = False):
    return field(default=None, metadata={"kind": "linear", "optional": True}) if optional else field(
        metadata={"kind": "linear", "optional": False})


def _experts():
    return field(default=None, metadata={"kind": "experts", "optional": True})


@dataclass
class LayerWeights:
    """One layer's weights. Norms are float32 vectors; linears are `models.linear` objects.

    The loader and the conversion cache build and store this from its fields (their metadata
    says "norm" or "linear"); a new field is a new weight every path picks up.
    """

    attn_norm: torch.Tensor = _norm()  # (H,)
    qkv: object = _linear()  # H -> (heads + 2·kv_heads)·D, Q/K rows in interleaved-pair order
    o: object = _linear()  # heads·D -> H
    mlp_norm: torch.Tensor = _norm()  # (H,)
    gate_up: object = _linear(optional=True)  # H -> 2·I (None in a mixture-of-experts layer)
    down: object = _linear(optional=True)  # I -> H
    q_norm: torch.Tensor | None = _norm(optional=True)  # (D,) per-head RMSNorm of q (Qwen3)
    k_norm: torch.Tensor | None = _norm(optional=True)  # (D,) per-head RMSNorm of k (Qwen3)
    attn_post_norm: torch.Tensor | None = _norm(optional=True)  # (H,) RMSNorm of O's output (Gemma 3)
    mlp_post_norm: torch.Tensor | None = _norm(optional=True)  # (H,) RMSNorm of down's output (Gemma 3)
    # A mixture-of-experts MLP (models/moe.py) in place of gate_up / down:
    router: object = _linear(optional=True)  # H -> E, float32
    # Qwen2-MoE's shared expert: gate_up / down run on every token, scaled by sigmoid(h·w_s).
    shared_expert_gate: object = _linear(optional=True)  # H -> 1, float32
    expert_gate_up: list | None = _experts()  # E linears H -> 2·I_e
    expert_down: list | None = _experts()  # E linears I_e -> H


LINEAR_FIELDS = tuple(f.name for f in fields(LayerWeights) if f.metadata["kind"] == "linear")
NORM_FIELDS = tuple(f.name for f in fields(LayerWeights) if f.metadata["kind"] == "norm")
EXPERT_FIELDS = tuple(f.name for f in fields(LayerWeights) if f.metadata["kind"] == "experts")
OPTIONAL_FIELDS = frozenset(f.name for f in fields(LayerWeights) if f.metadata.get("optional"))


class Ops(Protocol):
    """How a layer's attention and residual add + norm run (see the module docstring)."""

    def attend(self, index: int, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (..., (heads + 2·kv_heads)·D) -> attention output (..., heads·D), matmul dtype."""

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None,
                 weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, RMSNorm(x + delta)·weight in the matmul dtype)."""

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) ⊙ up of `[gate | up]` (..., 2·I) -> (..., I)."""

    def buffer(self, name: str, linear) -> torch.Tensor | None:
        """Where `linear`'s output goes: a reused (N, out_features) buffer, or None (a fresh tensor)."""


def decoder_layer(config, layer: LayerWeights, x: torch.Tensor, h: torch.Tensor, index: int, ops: Ops,
                  next_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer on `x (..., H)` float32 (the residual stream) and `h = attn_norm(x)` in the
    matmul dtype. Returns `(x, next_norm(x))`: the next layer's normalised input (the final
    norm after the last layer), so the two paths can fuse each residual add with the next norm.
    """
    qkv = layer.qkv(h, ops.buffer("qkv", layer.qkv))  # (..., (heads + 2·kv_heads)·D)
    if layer.q_norm is not None:
        qkv = qk_rms_norm(qkv, layer.q_norm, layer.k_norm, config.num_attention_heads,
                          config.num_key_value_heads, config.rms_norm_eps)
    attn = ops.attend(index, qkv)  # (..., heads·D)
    delta = layer.o(attn, ops.buffer("o", layer.o))
    if layer.attn_post_norm is not None:
        delta = F.rms_norm(delta.float(), delta.shape[-1:], layer.attn_post_norm, config.rms_norm_eps)
    x, h = ops.add_norm(x, delta, layer.mlp_norm)
    if layer.router is not None:  # a mixture of experts (Qwen3-MoE, Mixtral, Qwen2-MoE)
        return ops.add_norm(x, moe_mlp(layer, h, config.num_experts_per_tok, config.norm_topk_prob), next_norm)
    gate_up = layer.gate_up(h, ops.buffer("gate_up", layer.gate_up))
    delta = layer.down(ops.gated(gate_up, config.hidden_activation), ops.buffer("down", layer.down))
    if layer.mlp_post_norm is not None:
        delta = F.rms_norm(delta.float(), delta.shape[-1:], layer.mlp_post_norm, config.rms_norm_eps)
    return ops.add_norm(x, delta, next_norm)


def qk_rms_norm(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, heads: int, kv_heads: int,
                eps: float) -> torch.Tensor:
    """RMSNorm over each head's D dims of q and of k (Qwen3), before RoPE; v unchanged.

    qkv: (..., (heads + 2·kv_heads)·D) any float dtype -> the same shape, float32.
    """
    dim = q_weight.shape[0]
    q, k, v = qkv.float().split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q = F.rms_norm(q.unflatten(-1, (heads, dim)), (dim,), q_weight, eps).flatten(-2)
    k = F.rms_norm(k.unflatten(-1, (kv_heads, dim)), (dim,), k_weight, eps).flatten(-2)
    return torch.cat((q, k, v), dim=-1)


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs: dims (2i, 2i+1) as one complex number times e^{i·pos·θ_i}.

    x: (B, T, heads, D) float32 (any strides with a unit last stride); rotation: (B, T, 1, D/2)
    complex64. Returns a new (B, T, heads, D) float32 tensor. One complex multiply.
    """
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2)
