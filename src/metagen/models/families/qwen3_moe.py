"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 layer (q/k RMSNorm, no biases) with a
mixture of SwiGLU experts in every layer's MLP (`models/moe.py`), top-k renormalised when
`norm_topk_prob`. HF checkpoints name the router `mlp.gate` and each expert
`mlp.experts.{e}.{gate,up,down}_proj`; llama.cpp's GGUF (architecture "qwen3moe") stores the
router as `ffn_gate_inp` and the experts stacked as `ffn_{gate,up,down}_exps`, rotate-half Q/K.
Dense layers between sparse ones (`decoder_sparse_step` > 1, `mlp_only_layers`) are refused.
llama.cpp renormalises qwen3moe's top-k whatever the file says; a GGUF file's own
`expert_weights_norm` is honoured when it sets one (the model's own choice).
"""

from metagen.models.families.family import (MOE_HF_CONFIG_ALIASES, MOE_LAYER_NAMES, MOE_LINEARS, QK_NORM_NAMES, Family,
                                            expert_names)

QWEN3_MOE = Family(
    "qwen3_moe",
    layer_names={**MOE_LAYER_NAMES, **QK_NORM_NAMES},
    linears=MOE_LINEARS,
    hf_config_aliases=MOE_HF_CONFIG_ALIASES,
    qk_norm=True,
    hf_leading_global_layers="max_window_layers",  # as Qwen2's
    gguf_architecture="qwen3moe",
    expert_names=expert_names("gate_proj", "up_proj", "down_proj"),
)
FAMILIES = (QWEN3_MOE,)
