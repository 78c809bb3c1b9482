"""Model families: what distinguishes one decoder from another, as data.

A `Family` (`family.py`) says which optional weights a layer has (biases, q/k norms, a router and
experts), how a checkpoint's tensor names map onto the canonical names of `models/weights.py`
(one map per file format), which canonical parts are fused into each linear of `LayerWeights`,
how its GGUF files order Q/K rows, and the config conventions only its files follow. The forward
is shared (`models/layer.py`); a family never copies it. This module is the registry: it looks a
checkpoint's family up by the name its file gives.

Adding a family (a pre-norm decoder, dense or a mixture of experts):

1. Compare the HF modeling file with `layer.decoder_layer`. If the layer is the same up to which
   weights exist and what they are called, it is a family; if it needs a new operation (as
   Gemma 3's post-norms, GeGLU and local RoPE did), add that to the layer first as an optional
   weight or a `ModelConfig` field (both execution paths run the one layer body) and refuse it
   until then.
2. Write `<name>.py` here (see llama.py, qwen3.py, phi3.py), importing `Family` and the shared
   name maps from `family.py`: `Family("<model_type>", layer_names={canonical: (HF suffix, GGUF
   suffix)}, linears=..., gguf_rotate_half=..., qk_norm=..., attention_bias=...)`, starting from
   `LLAMA_LAYER_NAMES` / `LLAMA_LINEARS` (`QK_NORM_NAMES` for q/k norms); export it in the
   module's `FAMILIES` and add the module to `_registry` below. GGUF names are those of
   llama.cpp's `convert_hf_to_gguf.py`; `gguf_rotate_half` is False only where that converter
   permutes Q/K (Llama, Mistral).
3. The readers (`hf_reader.hf_config`, `gguf_reader.gguf_config`) read the config through the
   family's fields: a key the family names differently is an `hf_config_aliases` entry, a
   convention of its own a field of `Family` the readers consult, never a test of its name in a
   reader. Fields whose feature is not implemented go into `hf_reader.refuse_unsupported`, with
   a test.
4. A mixture of experts (qwen3_moe.py, mixtral.py; qwen2_moe.py for a shared expert) starts from
   `MOE_LAYER_NAMES` (the attention and the router), `MOE_LINEARS` and `MOE_HF_CONFIG_ALIASES`,
   gives `expert_names` for gate / up / down (`expert_names(...)` where its experts are stacked
   as llama.cpp's `ffn_*_exps`), and sets `gguf_architecture` where llama.cpp's name
   differs and `always_normalize` where the model renormalises the top-k weights whatever its
   config says.
5. Add it to `FAMILIES` of tests/models/families/tiny_checkpoints.py (its transformers config and
   class): the parity tests then build a tiny random checkpoint and compare logits with
   transformers (fp32, 1e-4) over a prompt and through truncate / fork / ragged appends on both
   paths.
"""

from __future__ import annotations

from collections.abc import Mapping

from metagen.models.families.family import Family


def _registry() -> dict[str, Family]:
    from metagen.models.families import gemma3, llama, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe

    modules = (llama, qwen2, qwen3, phi3, gemma3, qwen3_moe, mixtral, qwen2_moe)
    families = [family for module in modules for family in module.FAMILIES]
    return {name: family for family in families for name in (family.architecture, family.hf_model_type) if name}


FAMILIES: dict[str, Family] = {}
# The family of a config.json that names no model_type.
HF_DEFAULT_MODEL_TYPE = "llama"
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


def family_for_hf(raw: Mapping, where: str) -> Family:
    """The family of an HF config.json (`raw`) by its `model_type`; NotImplementedError naming a
    model type a family refuses (`Family.hf_refused_model_types`) or no family runs."""
    if not FAMILIES:
        FAMILIES.update(_registry())
    model_type = raw.get("model_type", HF_DEFAULT_MODEL_TYPE)
    for family in FAMILIES.values():
        if model_type in family.hf_refused_model_types:
            raise NotImplementedError(f"{where}: model_type {model_type!r} {family.hf_refused_model_types[model_type]}")
    return family_for(model_type, where)
