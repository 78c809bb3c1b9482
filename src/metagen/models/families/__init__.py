"""Model families: what distinguishes one decoder from another, as data.

A `Family` says which optional weights a layer has (biases, q/k norms, a router and experts), how
a checkpoint's tensor
names map onto the canonical names of `models/weights.py` (one map per file format), which
canonical parts are fused into each linear of `LayerWeights`, and how its GGUF files order Q/K
rows. The forward is shared (`models/layer.py`); a family never copies it.

Adding a family (a pre-norm decoder, dense or a mixture of experts):

1. Compare the HF modeling file with `layer.decoder_layer`. If the layer is the same up to which
   weights exist and what they are called, it is a family; if it needs a new operation (as
   Gemma 3's post-norms, GeGLU and local RoPE did), add that to the layer first as an optional
   weight or a `ModelConfig` field (both execution paths run the one layer body) and refuse it
   until then.
2. Write `<name>.py` here (see llama.py, qwen3.py, phi3.py): `Family("<model_type>",
   layer_names={canonical: (HF suffix, GGUF suffix)}, linears=..., gguf_rotate_half=...,
   qk_norm=..., attention_bias=...)`, starting from `LLAMA_LAYER_NAMES` / `LLAMA_LINEARS`; export
   it in the module's `FAMILIES` and add the module to `_registry` below. GGUF names are those of
   llama.cpp's `convert_hf_to_gguf.py`; `gguf_rotate_half` is False only where that converter
   permutes Q/K (Llama, Mistral).
3. Config fields the family reads go through `weights.hf_config` / `weights.gguf_config`; fields
   whose feature is not implemented go into `weights._refuse_unsupported`, with a test.
4. A mixture of experts (qwen3_moe.py, mixtral.py; qwen2_moe.py for a shared expert) starts from
   `MOE_LINEARS`, names the router in `layer_names`, gives `expert_names` for gate / up / down,
   and sets `gguf_architecture` where llama.cpp's name differs and `always_normalize` where the
   model renormalises the top-k weights whatever its config says.
5. Add it to `FAMILIES` of tests/models/families/tiny_checkpoints.py (its transformers config and
   class): the parity tests then build a tiny random checkpoint and compare logits with
   transformers (fp32, 1e-4) over a prompt and through truncate / fork / ragged appends on both
   paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Canonical per-layer names (models/weights.py) -> (HF suffix after `model.layers.{i}.`, GGUF suffix
# after `blk.{i}.`), shared by the Llama-style families.
LLAMA_LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", "attn_norm.weight"),
    "q": ("self_attn.q_proj.weight", "attn_q.weight"),
    "k": ("self_attn.k_proj.weight", "attn_k.weight"),
    "v": ("self_attn.v_proj.weight", "attn_v.weight"),
    "q_bias": ("self_attn.q_proj.bias", "attn_q.bias"),
    "k_bias": ("self_attn.k_proj.bias", "attn_k.bias"),
    "v_bias": ("self_attn.v_proj.bias", "attn_v.bias"),
    "o": ("self_attn.o_proj.weight", "attn_output.weight"),
    "mlp_norm": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "gate": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "up": ("mlp.up_proj.weight", "ffn_up.weight"),
    "down": ("mlp.down_proj.weight", "ffn_down.weight"),
}
# LayerWeights linear -> (canonical weight parts stacked along the output rows, their bias parts)
LLAMA_LINEARS = {
    "qkv": (("q", "k", "v"), ("q_bias", "k_bias", "v_bias")),
    "o": (("o",), ()),
    "gate_up": (("gate", "up"), ()),
    "down": (("down",), ()),
}
# A mixture-of-experts layer: the router replaces gate_up / down, each expert's parts are
# canonical `experts.{e}.gate` / `.up` / `.down` fused into `expert_gate_up` / `expert_down`.
MOE_LINEARS = {"qkv": LLAMA_LINEARS["qkv"], "o": LLAMA_LINEARS["o"], "router": (("router",), ())}
EXPERT_LINEARS = {"expert_gate_up": ("gate", "up"), "expert_down": ("down",)}
# transformers >= 5 may save the experts of a layer stacked: HF suffix -> the canonical parts its
# (E, rows, in) tensor holds along the rows, in order.
HF_STACKED_EXPERTS = {"mlp.experts.gate_up_proj": ("gate", "up"), "mlp.experts.down_proj": ("down",)}


@dataclass(frozen=True)
class Family:
    """A pre-norm decoder family.

    architecture: HF `model_type` (and GGUF `general.architecture` unless `gguf_architecture`).
    layer_names: canonical name -> (HF name, GGUF name) of each per-layer tensor.
    linears: each linear of `LayerWeights` -> (weight parts, bias parts), fused in that order.
    gguf_rotate_half: its GGUF files keep Q/K rows in rotate-half (NEOX) order (llama.cpp
        converts only Llama/Mistral to interleaved pairs); they are permuted on load.
    qk_norm: per-head RMSNorm of q and k before RoPE (canonical `q_norm`, `k_norm`).
    attention_bias: q/k/v biases when config.json does not say (`attention_bias`).
    hf_model_type: the HF `model_type` when it differs from the GGUF architecture name.
    post_norms: RMSNorm of each sublayer's output before the residual add (`attn_post_norm`,
        `mlp_post_norm`).
    hf_norm_offset: added to every RMSNorm weight read from HF files ((1 + w) norms, Gemma);
        llama.cpp's converter already adds it to GGUF files, so GGUF weights are taken as stored.
    activation: the MLP gate's activation when the file does not say (GGUF files never do).
    scaled_embedding: embeddings are multiplied by sqrt(hidden_size) (Gemma).
    local_rope_theta: RoPE base of sliding-window layers when the file does not say (Gemma 3).
    window_pattern: every n-th layer is global, the others sliding, when the file gives no layer
        types (transformers' Gemma 3 default; llama.cpp fixes 6 for Gemma 3 GGUF files).
    gguf_architecture: GGUF `general.architecture` when it differs ("qwen3moe"; Mixtral is "llama"
        with experts).
    expert_names: a mixture of experts: per-expert canonical part (gate, up, down) -> (HF name
        with `{e}` for the expert, GGUF name of the (E, rows, in) stacked tensor); empty if dense.
    always_normalize: top-k router weights renormalised whatever the config says (Mixtral);
        otherwise config.json's `norm_topk_prob` (Qwen3-MoE, Qwen2-MoE).
    shared_expert: a shared expert beside the routed ones (Qwen2-MoE: canonical gate, up, down
        and shared_gate, with `shared_expert_intermediate_size`).
    hf_renames: older HF name pieces -> today's, applied to each layer tensor's name before the
        lookup (Mixtral's `block_sparse_moe.` before transformers 5).
    gguf_single_experts: its GGUF files may hold one tensor per expert, `blk.{i}.ffn_gate.{e}.weight`,
        instead of the stacked `ffn_gate_exps` (llama.cpp's first Mixtral files).
    gguf_row_vectors: canonical names of H -> 1 linears llama.cpp stores as (H,) vectors, read
        as (1, H) (Qwen2-MoE's shared_gate).
    gguf_hidden_query_scale: block counts whose GGUF files (which carry no query_pre_attn_scalar)
        scale queries by (hidden / heads)^(−1/2) rather than head_dim's, as llama.cpp does (Gemma 3
        27B: 62 blocks).
    """

    architecture: str
    layer_names: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(LLAMA_LAYER_NAMES))
    linears: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=lambda: dict(LLAMA_LINEARS))
    gguf_rotate_half: bool = True
    qk_norm: bool = False
    attention_bias: bool = False
    hf_model_type: str | None = None
    post_norms: bool = False
    hf_norm_offset: float = 0.0
    activation: str = "silu"
    scaled_embedding: bool = False
    local_rope_theta: float | None = None
    window_pattern: int | None = None
    gguf_architecture: str = ""
    expert_names: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    always_normalize: bool = False
    shared_expert: bool = False
    hf_renames: Mapping[str, str] = field(default_factory=dict)
    gguf_single_experts: bool = False
    gguf_row_vectors: frozenset[str] = frozenset()
    gguf_hidden_query_scale: frozenset[int] = frozenset()

    @property
    def moe(self) -> bool:
        return bool(self.expert_names)

    @property
    def gguf_name(self) -> str:
        return self.gguf_architecture or self.architecture

    def hf_names(self) -> dict[str, str]:
        """HF suffix -> canonical name."""
        return {hf: canonical for canonical, (hf, _) in self.layer_names.items()}

    def gguf_names(self) -> dict[str, str]:
        """GGUF suffix -> canonical name."""
        return {gguf: canonical for canonical, (_, gguf) in self.layer_names.items()}

    def required_layer_tensors(self) -> list[str]:
        """Canonical names every layer must have (biases are optional)."""
        names = ["attn_norm", "mlp_norm"] + (["q_norm", "k_norm"] if self.qk_norm else [])
        names += ["attn_post_norm", "mlp_post_norm"] if self.post_norms else []
        return names + [part for parts, _ in self.linears.values() for part in parts]


def _registry() -> dict[str, Family]:
    from metagen.models.families import gemma3, llama, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe

    modules = (llama, qwen2, qwen3, phi3, gemma3, qwen3_moe, mixtral, qwen2_moe)
    families = [family for module in modules for family in module.FAMILIES]
    return {name: family for family in families for name in (family.architecture, family.hf_model_type) if name}


FAMILIES: dict[str, Family] = {}
# Architectures users bring that the native backend does not run yet, with the reason.
KNOWN_UNSUPPORTED = {
    "gemma2": "Gemma 2 (logit soft-capping, local/global attention) is not implemented yet",
}


def family_for(architecture: str, where: str) -> Family:
    """The family of `architecture`; NotImplementedError naming it and what would load it."""
    if not FAMILIES:
        FAMILIES.update(_registry())
    family = FAMILIES.get(architecture)
    if family is None:
        reason = KNOWN_UNSUPPORTED.get(architecture)
        raise NotImplementedError(
            f"{where}: architecture {architecture!r}{f' ({reason})' if reason else ''} is not supported by the "
            f"native backend (supported: {', '.join(sorted(FAMILIES))}); load it with "
            f"metagen.models.TransformersModel instead"
        )
    return family


def family_for_gguf(architecture: str, experts: int, where: str) -> Family:
    """The family of a GGUF file's `general.architecture` with `experts` experts (Mixtral files say
    "llama" and carry experts); NotImplementedError naming what is not supported."""
    if not FAMILIES:
        FAMILIES.update(_registry())
    for family in FAMILIES.values():
        if family.gguf_name == architecture and family.moe == bool(experts):
            return family
    if any(family.gguf_name == architecture for family in FAMILIES.values()):
        kind = f"{architecture}.expert_count={experts} (a mixture of experts)" if experts else "a dense layer"
        raise NotImplementedError(f"{where}: {kind} is not supported for architecture {architecture!r} by the "
                                  f"native backend; load it with metagen.models.TransformersModel instead")
    return family_for(architecture, where)
