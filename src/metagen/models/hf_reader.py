"""The HF reader: a Hugging Face directory (config.json + *.safetensors) -> `ModelConfig` +
canonical `WeightSource`s.

config.json's `model_type` picks the family (`families.family_for_hf`); the family maps tensor
names (`Family.hf_names`, `hf_renames`, its experts', stacked experts split per expert), adds
the 1 of (1 + w) RMSNorm weights (`hf_norm_offset`), and says which config keys it names
otherwise (`hf_config_aliases`) and which conventions its files follow (the leading global
layers of a sliding window, `hf_leading_global_layers`). RoPE settings are read from top-level
`rope_theta` / `rope_scaling` or transformers >= 5's `rope_parameters` (one dict, or one per
layer kind: `full_attention`, `sliding_attention`).

What the native backend does not implement is refused by name before any tensor is read
(`refuse_unsupported`): an unknown or refused model type, mixtures of experts of another shape
(dense layers between sparse ones, shared experts where the family has none, experts in a dense
family), unsupported RoPE scalings, a partial rotary factor, another MLP activation, MLP biases,
logit soft-capping, bidirectional attention.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from metagen.models.config import ModelConfig, pattern_layer_types
from metagen.models.families import family_for_hf
from metagen.models.families.family import HF_STACKED_EXPERTS, Family
from metagen.models.rope import check_rope_scaling
from metagen.models.weights import WeightSource, rotary_row_order

SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_HF_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}


def read_hf_directory(path: str | Path) -> tuple[ModelConfig, dict[str, WeightSource]]:
    """Config and weight sources from an HF directory (config.json + *.safetensors)."""
    config, family = hf_config(path)
    return hf_sources(path, family, config)


def hf_config(path: str | Path) -> tuple[ModelConfig, Family]:
    """The `ModelConfig` and `Family` of an HF directory from its config.json; NotImplementedError
    naming a setting the native backend does not implement."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected an HF model directory or a .gguf file")
    raw = _read_json_object(config_path)
    family = family_for_hf(raw, str(config_path))
    refuse_unsupported(raw, config_path, family)

    def positive(key: str, default=None) -> int:
        return _positive_int(raw, key, config_path, default)

    heads = positive("num_attention_heads")
    # transformers >= 5 writes RoPE settings as one `rope_parameters` dict, or one dict per layer
    # kind: full_attention (global) and sliding_attention (local); older files use top-level
    # `rope_theta` and `rope_scaling`.
    rope = dict(raw.get("rope_parameters") or {})
    local_rope = {}
    if "full_attention" in rope or "sliding_attention" in rope:
        local_rope = dict(rope.get("sliding_attention") or {})
        rope = dict(rope.get("full_attention") or {})
    rope_theta = raw.get("rope_theta", rope.pop("rope_theta", 10000.0))
    rope_scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    check_rope_scaling(rope_scaling, str(config_path))
    if local_rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"{config_path}: rope_parameters.sliding_attention type "
                                  f"{local_rope['rope_type']!r} is not supported by the native backend (local "
                                  f"layers take unscaled RoPE)")
    # A file may write a sliding_window it does not use: use_sliding_window false turns it off.
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    layer_types = raw.get("layer_types")
    leading = family.hf_leading_global_layers
    if layer_types is None and window is not None and leading and leading in raw:  # the first ones are global
        first = _positive_int(raw, leading, config_path)
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(positive("num_hidden_layers"))]
    if layer_types is None and family.window_pattern is not None:
        pattern = raw.get("sliding_window_pattern", family.window_pattern)
        layer_types = pattern_layer_types(_positive_int(raw, "sliding_window_pattern", config_path, pattern),
                                          positive("num_hidden_layers"))
    local_theta = None
    if family.local_rope_theta is not None:
        local_theta = float(local_rope.get("rope_theta", raw.get("rope_local_base_freq", family.local_rope_theta)))
    scalar = raw.get("query_pre_attn_scalar")
    experts = {}
    if family.moe:
        experts = dict(num_experts=positive(family.hf_key(raw, "num_experts")),
                       num_experts_per_tok=positive("num_experts_per_tok"),
                       moe_intermediate_size=positive(family.hf_key(raw, "moe_intermediate_size")),
                       norm_topk_prob=family.always_normalize or bool(raw.get("norm_topk_prob", False)))
        if family.shared_expert:
            experts["shared_expert_intermediate_size"] = positive("shared_expert_intermediate_size")
    config = ModelConfig(
        architecture=family.architecture,
        vocab_size=positive("vocab_size"),
        hidden_size=positive("hidden_size"),
        intermediate_size=positive("intermediate_size"),
        num_hidden_layers=positive("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=positive("num_key_value_heads", heads),
        head_dim=positive("head_dim", positive("hidden_size") // heads),
        max_position_embeddings=positive("max_position_embeddings", 4096),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get(family.hf_key(raw, "attention_bias"), family.attention_bias)),
        name=path.name,
        qk_norm=family.qk_norm,
        sliding_window=None if window is None else positive("sliding_window"),
        layer_types=layer_types,
        rope_local_theta=local_theta,
        hidden_activation=_activation(raw, family.activation),
        embed_scale=positive("hidden_size") ** 0.5 if family.scaled_embedding else None,
        query_pre_attn_scalar=None if scalar is None else float(scalar),
        post_norms=family.post_norms,
        **experts,
    )
    return config, family


def hf_sources(path: str | Path, family: Family, config: ModelConfig) -> tuple[ModelConfig, dict[str, WeightSource]]:
    """The weight sources of an HF directory's *.safetensors under metagen's names, by the family's
    tensor-name map (`Family.hf_names`, `hf_renames`, its experts'), and the config (a checkpoint
    without lm_head ties its embeddings, whatever config.json says)."""
    from safetensors import safe_open

    path = Path(path)
    norm_offset = family.hf_norm_offset
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors files")
    layer_names = family.hf_names()
    for e in range(config.num_experts):  # one name per expert and part: "mlp.experts.3.up_proj.weight"
        layer_names.update({hf.format(e=e): f"experts.{e}.{part}" for part, (hf, _) in family.expert_names.items()})
    sources: dict[str, WeightSource] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name in _HF_GLOBAL_NAMES:
                    key = _HF_GLOBAL_NAMES[name]
                elif name.startswith("model.layers."):
                    _, _, index, rest = name.split(".", 3)
                    for old, new in family.hf_renames.items():
                        rest = rest.replace(old, new)
                    if family.moe and rest in HF_STACKED_EXPERTS:
                        sources.update(_stacked_expert_sources(f"layers.{index}.experts.", handle.get_tensor(name),
                                                               HF_STACKED_EXPERTS[rest]))
                        continue
                    if rest not in layer_names:
                        continue
                    key = f"layers.{index}.{layer_names[rest]}"
                else:
                    continue
                tensor = handle.get_tensor(name)
                if norm_offset and key.split(".")[-1].endswith("norm"):  # (1 + w) RMSNorm
                    tensor = tensor.float() + norm_offset
                source = WeightSource(key, dense_tensor=tensor)
                source.row_order = rotary_row_order(key, source.dense_tensor.shape[0], config)
                sources[key] = source
    if config.tie_word_embeddings or "lm_head" not in sources:
        sources.pop("lm_head", None)
        config = ModelConfig(**{**config.__dict__, "tie_word_embeddings": True})
    return config, sources


def _stacked_expert_sources(prefix: str, stacked: torch.Tensor, parts: tuple[str, ...]) -> dict[str, WeightSource]:
    """Sources `{prefix}{e}.{part}` from an (E, rows, in) tensor whose rows hold `parts` in order
    (transformers >= 5's `gate_up_proj`: gate rows then up rows)."""
    sources = {}
    for e, expert in enumerate(stacked.unbind(0)):
        for part, rows in zip(parts, expert.chunk(len(parts), dim=0)):
            sources[f"{prefix}{e}.{part}"] = WeightSource(f"{prefix}{e}.{part}", dense_tensor=rows)
    return sources


def refuse_unsupported(raw: dict, path: Path, family: Family) -> None:
    """NotImplementedError naming a config.json field whose feature the backend lacks (for
    `family`: its mixture of experts, or none)."""
    moe, shared_expert = family.moe, family.shared_expert
    for key in ("num_local_experts", "num_experts"):
        if not moe and isinstance(raw.get(key), int) and raw[key] > 1:
            raise NotImplementedError(f"{path}: {key}={raw[key]} (a mixture of experts) is not supported by the "
                                      f"native backend for model_type {raw.get('model_type')!r}; load it with "
                                      f"metagen.models.TransformersModel instead")
    if moe:  # every layer sparse, softmax routing, a shared expert only where the family has one
        for key, allowed in (("decoder_sparse_step", 1), ("mlp_only_layers", []), ("shared_expert_intermediate_size", 0),
                             ("first_k_dense_replace", 0), ("moe_layer_freq", 1), ("n_shared_experts", 0)):
            if shared_expert and key == "shared_expert_intermediate_size":
                continue  # the family's own shared expert
            if raw.get(key) not in (None, allowed):
                raise NotImplementedError(f"{path}: {key}={raw[key]!r} (dense layers or shared experts beside the "
                                          f"routed ones) is not supported by the native backend (supported: "
                                          f"{allowed!r}); load it with metagen.models.TransformersModel instead")
    factor = raw.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
        raise NotImplementedError(f"{path}: partial_rotary_factor={factor} (RoPE on part of each head) is not "
                                  f"supported by the native backend")
    for key in ("hidden_activation", "hidden_act"):
        activation = raw.get(key)
        if activation is not None and activation not in SUPPORTED_ACTIVATIONS:
            raise NotImplementedError(f"{path}: {key}={activation!r} is not supported by the native backend "
                                      f"(supported: {', '.join(map(repr, SUPPORTED_ACTIVATIONS))})")
    if raw.get("mlp_bias"):
        raise NotImplementedError(f"{path}: mlp_bias=true is not supported by the native backend")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if raw.get(key) is not None:
            raise NotImplementedError(f"{path}: {key}={raw[key]} (logit soft-capping) is not supported by the native "
                                      f"backend; load it with metagen.models.TransformersModel instead")
    if raw.get("use_bidirectional_attention"):
        raise NotImplementedError(f"{path}: use_bidirectional_attention=true (an embedding model) is not supported "
                                  f"by the native backend")


def _activation(raw: dict, default: str) -> str:
    """The MLP gate's activation: `hidden_activation`, else `hidden_act`, else the family's."""
    return raw.get("hidden_activation") or raw.get("hidden_act") or default


def _read_json_object(path: Path) -> dict:
    """The JSON object in `path`; a ValueError naming the file (and line) when it is not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(raw).__name__}")
    return raw


def _positive_int(raw: dict, key: str, path: Path, default: int | None = None) -> int:
    """raw[key] as a positive int; `default` when absent or null (a required field has none)."""
    value = raw.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"{path} is missing the required field {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: field {key!r} is {value!r}, expected a positive integer")
    return value
