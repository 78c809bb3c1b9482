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

from metagen.models.families.family import MOE_HF_CONFIG_ALIASES, MOE_LAYER_NAMES, MOE_LINEARS, Family, expert_names

MIXTRAL = Family(
    "mixtral",
    layer_names=MOE_LAYER_NAMES,
    linears=MOE_LINEARS,
    gguf_rotate_half=False,
    gguf_architecture="llama",
    expert_names=expert_names("w1", "w3", "w2"),
    always_normalize=True,
    hf_config_aliases={**MOE_HF_CONFIG_ALIASES, "moe_intermediate_size": "intermediate_size"},
    hf_renames={"block_sparse_moe.": "mlp."},
    gguf_single_experts=True,
)
FAMILIES = (MIXTRAL,)
