"""Gemma 3 (text decoder; HF `Gemma3ForCausalLM`, model_type "gemma3_text", GGUF "gemma3").

The Llama layer with: (1 + w) RMSNorm weights, an RMSNorm after attention and after the MLP
before each residual add (pre- and post-norms), GeGLU (GELU, tanh approximation), embeddings
scaled by sqrt(hidden), per-head q/k RMSNorm, attention scale query_pre_attn_scalar^(−1/2), and
sliding-window local layers (RoPE base rope_local_base_freq, unscaled) alternating with global
ones (rope_theta with rope_scaling); tied embeddings. Gemma 3's HF `post_attention_layernorm` is
the attention's post-norm, not the MLP's pre-norm as in Llama.

llama.cpp's converter adds the 1 to every norm weight when it writes a GGUF, keeps Q/K rows in
rotate-half order, writes no layer pattern (its loader fixes every 6th layer global and the
local base at 10000) and no query_pre_attn_scalar (head_dim, or hidden / heads for the 62-layer
27B). Logit soft-capping (Gemma 2) is refused when the checkpoint is read, and so is the HF
model_type "gemma3" (Gemma3ForConditionalGeneration, the vision and text model around this
decoder). Transformers >= 5 writes the RoPE settings as one dict per layer kind
(`rope_parameters.full_attention` / `.sliding_attention`); the HF reader takes both layouts.
"""

from metagen.models.families.family import LLAMA_LAYER_NAMES, QK_NORM_NAMES, Family

_NAMES = {name: pair for name, pair in LLAMA_LAYER_NAMES.items() if not name.endswith("_bias") and name != "mlp_norm"}
GEMMA3 = Family(
    "gemma3",
    layer_names={
        **_NAMES,
        **QK_NORM_NAMES,
        "attn_post_norm": ("post_attention_layernorm.weight", "post_attention_norm.weight"),
        "mlp_norm": ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        "mlp_post_norm": ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    },
    qk_norm=True,
    hf_model_type="gemma3_text",
    post_norms=True,
    hf_norm_offset=1.0,
    activation="gelu_pytorch_tanh",
    scaled_embedding=True,
    local_rope_theta=10000.0,
    window_pattern=6,
    gguf_hidden_query_scale=frozenset({62}),
    hf_refused_model_types={
        "gemma3": "(Gemma3ForConditionalGeneration, vision and text) is not supported by the native backend; its "
                  "text decoder alone (model_type 'gemma3_text', Gemma3ForCausalLM) is",
    },
)
FAMILIES = (GEMMA3,)
