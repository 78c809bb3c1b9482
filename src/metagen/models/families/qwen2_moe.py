"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): the Qwen2 layer (q/k/v biases) with a mixture of
experts whose top-k weights are not renormalised (`norm_topk_prob`, false in these checkpoints),
plus a shared expert every token runs, scaled by σ(h·w_s) (`models/moe.py`). The shared expert
loads as the layer's gate_up / down. llama.cpp's GGUF ("qwen2moe") names it `ffn_{gate,up,down}_shexp`
and its gate `ffn_gate_inp_shexp`; rotate-half Q/K. A GGUF file that does not say
`expert_weights_norm` does not renormalise (neither does llama.cpp's qwen2moe graph). Some
config.json files say `qkv_bias` for `attention_bias`.
"""

from metagen.models.families.family import MOE_HF_CONFIG_ALIASES, MOE_LAYER_NAMES, MOE_LINEARS, Family, expert_names

QWEN2_MOE = Family(
    "qwen2_moe",
    layer_names={
        **MOE_LAYER_NAMES,
        "gate": ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
        "up": ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
        "down": ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
        "shared_gate": ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
    },
    linears={**MOE_LINEARS, "gate_up": (("gate", "up"), ()), "down": (("down",), ()),
             "shared_expert_gate": (("shared_gate",), ())},
    attention_bias=True,
    hf_config_aliases={**MOE_HF_CONFIG_ALIASES, "attention_bias": "qkv_bias"},
    hf_leading_global_layers="max_window_layers",  # as Qwen2's
    gguf_architecture="qwen2moe",
    expert_names=expert_names("gate_proj", "up_proj", "down_proj"),
    shared_expert=True,
    gguf_norm_topk=False,
    gguf_row_vectors=frozenset({"shared_gate"}),
)
FAMILIES = (QWEN2_MOE,)
