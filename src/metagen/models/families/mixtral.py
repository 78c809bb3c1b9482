"""Mixtral (8x7B, 8x22B): the Llama layer with a mixture of SwiGLU experts as its MLP, top-k
always renormalised (`models/moe.py`). HF checkpoints name the router `block_sparse_moe.gate`
and expert e's gate / down / up `block_sparse_moe.experts.{e}.w1 / w2 / w3` (transformers >= 5
says `mlp.` for `block_sparse_moe.`; the reader takes both); llama.cpp writes
Mixtral as a "llama" GGUF with `expert_count` set, Q/K interleaved, the router `ffn_gate_inp`
and the experts stacked as `ffn_{gate,up,down}_exps` (its first Mixtral files: one tensor per
expert, `ffn_gate.{e}`; the reader takes both). Its config.json sizes each expert by
`intermediate_size` (its experts are its feed-forward; so do its GGUF files, with
`feed_forward_length`).
"""

from metagen.models.families.family import LLAMA_LAYER_NAMES, MOE_HF_CONFIG_ALIASES, MOE_LINEARS, Family

MIXTRAL = Family(
    "mixtral",
    layer_names={
        **{name: pair for name, pair in LLAMA_LAYER_NAMES.items() if name not in ("gate", "up", "down")},
        "router": ("mlp.gate.weight", "ffn_gate_inp.weight"),
    },
    linears=MOE_LINEARS,
    gguf_rotate_half=False,
    gguf_architecture="llama",
    expert_names={
        "gate": ("mlp.experts.{e}.w1.weight", "ffn_gate_exps.weight"),
        "up": ("mlp.experts.{e}.w3.weight", "ffn_up_exps.weight"),
        "down": ("mlp.experts.{e}.w2.weight", "ffn_down_exps.weight"),
    },
    always_normalize=True,
    hf_config_aliases={**MOE_HF_CONFIG_ALIASES, "moe_intermediate_size": "intermediate_size"},
    hf_renames={"block_sparse_moe.": "mlp."},
    gguf_single_experts=True,
)
FAMILIES = (MIXTRAL,)
