"""`Family`, the data that tells one decoder family from another, and the name maps families share.

A family module (`models/families/<name>.py`) imports this module, never the registry of
`models/families/__init__.py`, so the registry imports the families without a cycle. The readers
(`models/gguf_reader.py`, `models/hf_reader.py`) read a checkpoint through these fields and name
no family themselves: a convention only some families' files follow is a field here.
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
# Per-head RMSNorm weights of q and k (`Family.qk_norm`: Qwen3, Qwen3-MoE, Gemma 3).
QK_NORM_NAMES = {
    "q_norm": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "k_norm": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
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
# The Llama layer's names in a mixture of experts: its attention, and the router where its MLP was
# (the MLP's gate / up / down are the experts', `expert_names`).
MOE_LAYER_NAMES = {
    **{name: pair for name, pair in LLAMA_LAYER_NAMES.items() if name not in ("gate", "up", "down")},
    "router": ("mlp.gate.weight", "ffn_gate_inp.weight"),
}
# config.json keys of a mixture of experts under another name: transformers' configs map
# `num_experts` to `num_local_experts` (their `attribute_map`) and save it so.
MOE_HF_CONFIG_ALIASES = {"num_experts": "num_local_experts"}
# transformers >= 5 may save the experts of a layer stacked: HF suffix -> the canonical parts its
# (E, rows, in) tensor holds along the rows, in order.
HF_STACKED_EXPERTS = {"mlp.experts.gate_up_proj": ("gate", "up"), "mlp.experts.down_proj": ("down",)}


def expert_names(gate: str, up: str, down: str) -> dict[str, tuple[str, str]]:
    """`Family.expert_names` of experts whose HF tensors are `mlp.experts.{e}.<name>.weight` for the
    names given (gate, up, down): the GGUF names are llama.cpp's stacked `ffn_{gate,up,down}_exps`."""
    return {part: (f"mlp.experts.{{e}}.{name}.weight", f"ffn_{part}_exps.weight")
            for part, name in (("gate", gate), ("up", up), ("down", down))}


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
    gguf_norm_topk: renormalise the top-k router weights when a GGUF file does not say
        (`expert_weights_norm`), as llama.cpp's graph of the architecture does.
    hf_config_aliases: config.json key the reader asks for -> this family's own name for it, read
        when the first is absent (`num_experts` written as `num_local_experts`).
    hf_leading_global_layers: config.json key counting the leading layers that stay global when
        the file turns its sliding window on (`use_sliding_window`) and gives no `layer_types`;
        the later layers slide. Empty: every layer slides.
    hf_refused_model_types: HF `model_type`s of relatives the native backend does not run (a
        multimodal model around this family's decoder) -> what the refusal says after the name.
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
    gguf_norm_topk: bool = True
    hf_config_aliases: Mapping[str, str] = field(default_factory=dict)
    hf_leading_global_layers: str = ""
    hf_refused_model_types: Mapping[str, str] = field(default_factory=dict)

    @property
    def moe(self) -> bool:
        return bool(self.expert_names)

    @property
    def gguf_name(self) -> str:
        return self.gguf_architecture or self.architecture

    def hf_key(self, raw: Mapping, key: str) -> str:
        """The config.json key to read for `key`: `key` itself unless it is absent (or null) and
        the family names it otherwise (`hf_config_aliases`)."""
        if raw.get(key) is None and key in self.hf_config_aliases:
            return self.hf_config_aliases[key]
        return key

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
