"""Qwen3 (dense): the Llama layer with a per-head RMSNorm of q and of k before RoPE, no biases,
an explicit head_dim (128 for every size, not hidden / heads). GGUF Q/K rows in rotate-half
order, so the q/k norm weights (over one head's dims) are permuted like a head's rows.
"""

from metagen.models.families.family import LLAMA_LAYER_NAMES, QK_NORM_NAMES, Family

QWEN3 = Family(
    "qwen3",
    layer_names={
        **LLAMA_LAYER_NAMES,
        **QK_NORM_NAMES,
    },
    qk_norm=True,
    hf_leading_global_layers="max_window_layers",  # as Qwen2's
)
FAMILIES = (QWEN3,)
