"""Phi-3 / Phi-3.5 / Phi-4 (dense): the Llama layer with Q·K·V and gate·up stored fused.

`qkv_proj` holds the q, k and v rows stacked, `gate_up_proj` the gate and up rows: each loads as
one part of the matching fused linear. llama.cpp's GGUF names them `attn_qkv` and `ffn_up` (the
latter holding gate and up), rotate-half order. Longrope scaling (Phi-3-*-128k) and a partial
rotary factor (Phi-4-mini) are refused when the checkpoint is read.
"""

from metagen.models.families.family import LLAMA_LAYER_NAMES, Family

_NAMES = {name: pair for name, pair in LLAMA_LAYER_NAMES.items() if name not in ("q", "k", "v", "gate", "up")}
PHI3 = Family(
    "phi3",
    layer_names={
        **{name: pair for name, pair in _NAMES.items() if not name.endswith("_bias")},
        "qkv": ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
        "gate_up": ("mlp.gate_up_proj.weight", "ffn_up.weight"),
    },
    linears={"qkv": (("qkv",), ()), "o": (("o",), ()), "gate_up": (("gate_up",), ()), "down": (("down",), ())},
)
FAMILIES = (PHI3,)
