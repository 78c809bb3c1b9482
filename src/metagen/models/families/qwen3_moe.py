"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 layer (q/k RMSNorm, no biases) with a
mixture of SwiGLU experts in every layer's MLP (`models/moe.py`), top-k renormalised when
`norm_topk_prob`. HF checkpoints name the router `mlp.gate` and each expert
`mlp.experts.{e}.{gate,up,down}_proj`; llama.cpp's GGUF (architecture "qwen3moe") stores the
router as `ffn_gate_inp` and the experts stacked as `ffn_{gate,up,down}_exps`, rotate-half Q/K.
Dense layers between sparse ones (`decoder_sparse_step` > 1, `mlp_only_layers`) are refused.
llama.cpp renormalises qwen3moe's top-k whatever the file says; a GGUF file's own
`expert_weights_norm` is honoured when it sets one (the model's own choice).
"""

from metagen.models.families.family import LLAMA_LAYER_NAMES, MOE_HF_CONFIG_ALIASES, MOE_LINEARS, Family

_ATTENTION = {name: pair for name, pair in LLAMA_LAYER_NAMES.items() if name not in ("gate", "up", "down")}
QWEN3_MOE = Family(
    "qwen3_moe",
    layer_names={
        **_ATTENTION,
        "q_norm": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        "k_norm": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        "router": ("mlp.gate.weight", "ffn_gate_inp.weight"),
    },
    linears=MOE_LINEARS,
    hf_config_aliases=MOE_HF_CONFIG_ALIASES,
    qk_norm=True,
    hf_leading_global_layers="max_window_layers",  # as Qwen2's
    gguf_architecture="qwen3moe",
    expert_names={
        "gate": ("mlp.experts.{e}.gate_proj.weight", "ffn_gate_exps.weight"),
        "up": ("mlp.experts.{e}.up_proj.weight", "ffn_up_exps.weight"),
        "down": ("mlp.experts.{e}.down_proj.weight", "ffn_down_exps.weight"),
    },
)
FAMILIES = (QWEN3_MOE,)
