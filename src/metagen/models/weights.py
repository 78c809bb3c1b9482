"""Checkpoint readers: GGUF files and HF safetensors directories -> config + weight sources.

Both readers return a `ModelConfig` and a dict of `WeightSource`s under one naming scheme:
`embed`, `norm`, `lm_head`, `rope_freqs` and `layers.{i}.{name}` for the canonical names of the
checkpoint's family (`models/families/`: attn_norm, q, k, v, q_bias, ..., or fused qkv and
gate_up; a mixture of experts has `router` and `experts.{e}.gate` / `.up` / `.down` per expert,
split out of stacked (E, rows, in) tensors where the file stores them so). Weights of linear
layers are `(out_features, in_features)` with Q/K rows (and q/k norm weights) permuted into the
interleaved-pair order of `layer.apply_rope`. RMSNorm weights are returned as the layer
multiplies by them: a (1 + w) family's HF weights get their 1 here (`Family.hf_norm_offset`);
its GGUF files already hold 1 + w.

Checkpoint features the backend does not implement are refused by name here, before any tensor
is read: unknown architectures, mixtures of experts of another shape (more shared experts than
Qwen2-MoE's one, dense layers between sparse ones, another gating function), unsupported RoPE
scalings, a partial rotary factor, another MLP activation, MLP biases, logit soft-capping,
bidirectional attention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from metagen.models.config import ModelConfig
from metagen.models.families import HF_STACKED_EXPERTS, Family, family_for, family_for_gguf
from metagen.models.rope import check_rope_scaling

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}
_HF_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
_ROTARY_KEYS = ("q", "k", "q_bias", "k_bias", "q_norm", "k_norm", "qkv")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def pattern_layer_types(pattern: int, num_layers: int) -> tuple[str, ...]:
    """Every `pattern`-th layer global, the others sliding (Gemma 3's `sliding_window_pattern`)."""
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers))


@dataclass
class WeightSource:
    """One checkpoint tensor, dequantized on demand.

    `raw`/`qtype` keep GGUF's packed blocks so Q4_0 / Q4_1 / Q4_K can map exactly onto int4 codes;
    `row_order` is a permutation applied to output rows (Q/K into the interleaved RoPE order).
    """

    name: str
    dense_tensor: torch.Tensor | None = None
    raw: np.ndarray | None = None
    qtype: object = None  # gguf.GGMLQuantizationType
    row_order: np.ndarray | None = None

    @property
    def type_name(self) -> str:
        return "dense" if self.qtype is None else self.qtype.name

    def dense(self) -> torch.Tensor:
        """The weight as float32 (out, in) (or a 1-D vector)."""
        if self.dense_tensor is not None:
            tensor = self.dense_tensor.float()
        else:
            from gguf.quants import dequantize

            try:
                tensor = torch.from_numpy(np.ascontiguousarray(dequantize(self.raw, self.qtype), dtype=np.float32))
            except NotImplementedError as error:
                raise NotImplementedError(
                    f"tensor {self.name!r} uses GGML type {self.qtype.name}, which the gguf package cannot dequantize"
                ) from error
        if self.row_order is not None:
            tensor = tensor[torch.from_numpy(self.row_order)]
        return tensor.contiguous()

    def int4_codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Exact (codes (N, K), scales (N, K/32), zeros (N, K/32)) for Q4_0 / Q4_1 / Q4_K, else None
        (see `gguf_blocks`)."""
        from metagen.models.gguf_blocks import int4_codes

        exact = int4_codes(self.raw, self.type_name) if self.raw is not None else None
        if exact is None:
            return None
        out = [torch.from_numpy(np.ascontiguousarray(part)) for part in exact]
        if self.row_order is not None:
            order = torch.from_numpy(self.row_order)
            out = [t[order] for t in out]
        return out[0], out[1], out[2]


    def group_codes(self):
        """The grouped kernel's exact `GroupCodes` for Q4_K / Q5_0 / Q5_1 / Q5_K / Q6_K / Q8_0, else None
        (see `gguf_blocks`)."""
        from metagen.models.gguf_blocks import group_codes

        exact = group_codes(self.raw, self.type_name) if self.raw is not None else None
        if exact is not None and self.row_order is not None:
            exact.take_rows(self.row_order)
        return exact

def interleave_rows(num_rows: int, num_heads: int) -> np.ndarray:
    """Row order taking rotate-half Q/K rows (HF, NEOX) to interleaved pairs (llama.cpp).

    Target row (h, i, j), i < D/2, j < 2, comes from source row (h, j, i): for each target row
    we return its source row.
    """
    head_dim = num_rows // num_heads
    source = np.arange(num_rows).reshape(num_heads, 2, head_dim // 2)
    return np.ascontiguousarray(source.transpose(0, 2, 1)).reshape(-1)


def rotary_row_order(key: str, rows: int, config: ModelConfig) -> np.ndarray | None:
    """Row permutation into interleaved-pair order for a rotary tensor (q, k, their biases and
    norms, Phi-3's fused qkv) of `rows` rows; None for other tensors."""
    kind = key.rsplit(".", 1)[-1]
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    if kind in ("q", "q_bias"):
        return interleave_rows(rows, heads)
    if kind in ("k", "k_bias"):
        return interleave_rows(rows, kv_heads)
    if kind in ("q_norm", "k_norm"):
        return interleave_rows(rows, 1)
    if kind == "qkv":  # [q rows; k rows; v rows]: permute q and k within their heads, keep v
        q_rows, k_rows = heads * dim, kv_heads * dim
        return np.concatenate([interleave_rows(q_rows, heads), q_rows + interleave_rows(k_rows, kv_heads),
                               np.arange(q_rows + k_rows, rows)])
    return None


def open_gguf(path: str | Path):
    """`gguf.GGUFReader` of `path`; a ValueError naming the file when it is truncated or not GGUF.

    gguf memory-maps the file and slices each tensor out of it, so a truncated file otherwise
    fails deep inside numpy ("cannot reshape array ..."). Before the tensors are built, the end of
    the last tensor's data (data start + offset + elements·type_size/block_size) is compared with
    the file size.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    path = Path(path)
    size = path.stat().st_size

    class _Truncated(Exception):
        pass

    class CheckedReader(GGUFReader):
        def _build_tensors(self, start_offs, fields):
            expected = max((_tensor_end(start_offs, field) for field in fields), default=0)
            if expected > size:
                raise _Truncated(f"{path} is truncated: it has {size:,} bytes, but its tensor data needs {expected:,} "
                                 f"bytes; download or convert it again")
            super()._build_tensors(start_offs, fields)

    def _tensor_end(start: int, field) -> int:
        _, _, _, dims, raw_type, offset = field.parts  # name length, name, n_dims, dims, type, offset
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
        return int(start) + int(offset[0]) + int(np.prod(dims, dtype=np.int64)) * type_size // block_size

    try:
        return CheckedReader(str(path))
    except _Truncated as error:
        raise ValueError(str(error)) from None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} ({size:,} bytes) is not a readable GGUF file, it may be truncated or damaged "
            f"({type(error).__name__}: {error})"
        ) from None


def read_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, WeightSource], "object"]:
    """Config, weight sources and the open `gguf.GGUFReader` (for tokenizer metadata)."""
    reader = open_gguf(path)
    config, family = gguf_config(reader, path)
    return config, gguf_sources(reader, family, config), reader


def gguf_config(reader, path: str | Path) -> tuple[ModelConfig, Family]:
    """The `ModelConfig` and `Family` of an open GGUF file from its metadata (and which tensors it
    holds); NotImplementedError naming a field the native backend does not implement."""

    def field(key: str, default=None):
        entry = reader.fields.get(key)
        return default if entry is None else entry.contents()

    def required(key: str):
        value = field(key)
        if value is None:
            raise ValueError(f"{path} lacks the GGUF metadata field {key!r}")
        return value

    arch = field("general.architecture")
    experts = int(field(f"{arch}.expert_count", 0) or 0)
    family = family_for_gguf(arch, experts, f"GGUF file {path}")
    for key in (f"{arch}.final_logit_softcapping", f"{arch}.attn_logit_softcapping"):
        if field(key):
            raise NotImplementedError(f"{path}: {key}={field(key)} (logit soft-capping) is not supported by the "
                                      f"native backend; load it with metagen.models.TransformersModel instead")
    if experts:
        _refuse_unsupported_gguf_experts(field, arch, path, family.shared_expert)
    heads = int(required(f"{arch}.attention.head_count"))
    kv_heads = int(field(f"{arch}.attention.head_count_kv", heads))
    hidden = int(required(f"{arch}.embedding_length"))
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path} has no token_embd.weight tensor")
    if "rope_factors_long.weight" in names:
        raise NotImplementedError(f"{path}: rope_factors_long (longrope scaling) is not supported by the native "
                                  f"backend; load it with metagen.models.TransformersModel instead")
    vocab = int(field(f"{arch}.vocab_size", int(embed.shape[1])))
    rope_scaling = None
    scaling_type = field(f"{arch}.rope.scaling.type")
    if scaling_type and scaling_type != "none":
        rope_scaling = {"rope_type": scaling_type, "factor": float(field(f"{arch}.rope.scaling.factor", 1.0))}
        original = field(f"{arch}.rope.scaling.original_context_length")
        if original:
            rope_scaling["original_max_position_embeddings"] = int(original)
    check_rope_scaling(rope_scaling, str(path))
    head_dim = int(field(f"{arch}.attention.key_length", hidden // heads))
    rotary = int(field(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise NotImplementedError(f"{path}: {arch}.rope.dimension_count={rotary} rotates part of each head "
                                  f"(head dim {head_dim}); partial rotary embeddings are not supported")
    window = field(f"{arch}.attention.sliding_window")
    blocks = int(required(f"{arch}.block_count"))
    layer_types, local_theta, query_scalar = None, None, None
    if family.window_pattern is not None:  # local / global layers (Gemma 3), as llama.cpp's loader sets them
        pattern = field(f"{arch}.attention.sliding_window_pattern", family.window_pattern)
        layer_types = (pattern_layer_types(int(pattern), blocks) if isinstance(pattern, int) else
                       tuple("sliding_attention" if local else "full_attention" for local in pattern))
        local_theta = float(field(f"{arch}.rope.freq_base_swa", family.local_rope_theta))
    if blocks in family.gguf_hidden_query_scale:
        query_scalar = hidden // heads
    config = ModelConfig(
        architecture=family.architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(field(f"{arch}.feed_forward_length", 0) if experts
                              else required(f"{arch}.feed_forward_length")),
        num_hidden_layers=blocks,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(field(f"{arch}.context_length", 4096)),
        rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        name=str(field("general.name", Path(path).stem)),
        qk_norm=family.qk_norm,
        sliding_window=int(window) if window else None,
        layer_types=layer_types,
        rope_local_theta=local_theta,
        hidden_activation=family.activation,
        embed_scale=hidden**0.5 if family.scaled_embedding else None,
        query_pre_attn_scalar=query_scalar,
        post_norms=family.post_norms,
        num_experts=experts,
        num_experts_per_tok=int(required(f"{arch}.expert_used_count")) if experts else 0,
        # Mixtral's experts are its feed-forward. llama.cpp renormalises qwen3moe's top-k whatever
        # the file says; expert_weights_norm is honoured when a file sets it (the model's own choice).
        moe_intermediate_size=int(field(f"{arch}.expert_feed_forward_length", 0)
                                  or field(f"{arch}.feed_forward_length", 0)),
        # Qwen2-MoE checkpoints do not renormalise (llama.cpp's qwen2moe graph neither).
        norm_topk_prob=family.always_normalize or bool(field(f"{arch}.expert_weights_norm", not family.shared_expert)),
        shared_expert_intermediate_size=int(field(f"{arch}.expert_shared_feed_forward_length", 0) or 0),
    )
    return config, family


def gguf_sources(reader, family: Family, config: ModelConfig) -> dict[str, WeightSource]:
    """The weight sources of an open GGUF file under metagen's names, by the family's tensor-name
    map (llama.cpp's names: `Family.gguf_names`, its experts' and quirks' fields)."""
    layer_names = family.gguf_names()
    stacked_experts = {gguf: part for part, (_, gguf) in family.expert_names.items()}
    single_experts = {}
    if family.gguf_single_experts:  # blk.{i}.ffn_gate.{e}.weight
        single_experts = {gguf.removesuffix("_exps.weight"): part for gguf, part in stacked_experts.items()}
    sources: dict[str, WeightSource] = {}
    for tensor in reader.tensors:
        if tensor.name in _GGUF_GLOBAL_NAMES:
            key = _GGUF_GLOBAL_NAMES[tensor.name]
        else:
            parts = tensor.name.split(".", 2)
            if parts[0] != "blk" or len(parts) < 3:
                continue
            if parts[2] in stacked_experts:  # (E, rows, in): one source per expert
                for e, source in enumerate(_gguf_sources(tensor.name, tensor)):
                    source.name = f"layers.{parts[1]}.experts.{e}.{stacked_experts[parts[2]]}"
                    sources[source.name] = source
                continue
            kind, _, expert = parts[2].removesuffix(".weight").partition(".")
            if kind in single_experts and expert.isdigit():
                key = f"layers.{parts[1]}.experts.{expert}.{single_experts[kind]}"
            elif parts[2] in layer_names:
                key = f"layers.{parts[1]}.{layer_names[parts[2]]}"
            else:
                continue
        source = _gguf_sources(key, tensor)[0]
        if key.rpartition(".")[2] in family.gguf_row_vectors and source.dense_tensor is not None:  # (H,) -> (1, H)
            source.dense_tensor = source.dense_tensor.reshape(1, -1)
        # llama.cpp stores Llama-style Q/K interleaved already; rotate-half families need permuting.
        if family.gguf_rotate_half:
            rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else int(tensor.shape[0])
            source.row_order = rotary_row_order(key, rows, config)
        sources[key] = source
    return sources


def _gguf_sources(key: str, tensor) -> list[WeightSource]:
    """The sources of one GGUF tensor: one for a matrix or vector, one per expert (the leading
    dimension) for a stacked (E, rows, in) tensor of experts."""
    qtype = tensor.tensor_type
    shape = tuple(int(s) for s in reversed(tensor.shape))  # numpy order: (E, rows, in), (rows, in) or (n,)
    if qtype.name in ("F32", "F16", "BF16"):
        array = np.asarray(tensor.data)
        if qtype.name == "BF16":
            array = (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        dense = torch.from_numpy(np.array(array, dtype=np.float32).reshape(shape))
        if len(shape) == 3:
            return [WeightSource(key, dense_tensor=expert) for expert in dense.unbind(0)]
        return [WeightSource(key, dense_tensor=dense)]
    raw = np.asarray(tensor.data)  # quantized: (..., rows, bytes per row)
    if len(shape) == 3:
        raw = raw.reshape(shape[0], shape[1], -1)
        return [WeightSource(key, raw=raw[e], qtype=qtype) for e in range(shape[0])]
    return [WeightSource(key, raw=raw, qtype=qtype)]


def _refuse_unsupported_gguf_experts(field, arch: str, path, shared: bool) -> None:
    """NotImplementedError naming a GGUF mixture-of-experts field the backend does not implement."""
    for key, allowed in (("expert_shared_count", int(shared)), ("leading_dense_block_count", 0), ("expert_weights_scale", 1.0),
                         ("expert_gating_func", 1)):  # 1: softmax (gguf.ExpertGatingFuncType)
        value = field(f"{arch}.{key}")
        if value is not None and value != allowed:
            raise NotImplementedError(f"{path}: {arch}.{key}={value} is not supported by the native backend "
                                      f"(supported: {allowed}); load it with metagen.models.TransformersModel instead")


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
    if raw.get("model_type") == "gemma3":
        raise NotImplementedError(f"{config_path}: model_type 'gemma3' (Gemma3ForConditionalGeneration, vision and "
                                  f"text) is not supported by the native backend; its text decoder alone (model_type "
                                  f"'gemma3_text', Gemma3ForCausalLM) is")
    family = family_for(raw.get("model_type", "llama"), str(config_path))
    _refuse_unsupported(raw, config_path, family.moe, family.shared_expert)

    def positive(key: str, default=None) -> int:
        return _positive_int(raw, key, config_path, default)

    heads = positive("num_attention_heads")
    # transformers >= 5 writes RoPE settings as one `rope_parameters` dict; older files use
    # top-level `rope_theta` and `rope_scaling`.
    # Gemma 3 keeps one dict per layer kind: full_attention (global) and sliding_attention (local).
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
    # Qwen2/3 write a sliding_window they do not use unless use_sliding_window is true.
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    layer_types = raw.get("layer_types")
    if layer_types is None and window is not None and "max_window_layers" in raw:  # Qwen2/3: the first ones are global
        first = _positive_int(raw, "max_window_layers", config_path)
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
    if family.moe:  # Qwen3-MoE: num_experts, moe_intermediate_size; Mixtral: num_local_experts, intermediate_size
        experts = dict(num_experts=positive("num_experts", raw.get("num_local_experts")),
                       num_experts_per_tok=positive("num_experts_per_tok"),
                       moe_intermediate_size=positive("moe_intermediate_size", raw.get("intermediate_size")),
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
        attention_bias=bool(raw.get("attention_bias", raw.get("qkv_bias", family.attention_bias))),  # qkv_bias: Qwen2-MoE
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


def _refuse_unsupported(raw: dict, path: Path, moe: bool, shared_expert: bool = False) -> None:
    """NotImplementedError naming a config.json field whose feature the backend lacks."""
    for key in ("num_local_experts", "num_experts"):
        if not moe and isinstance(raw.get(key), int) and raw[key] > 1:
            raise NotImplementedError(f"{path}: {key}={raw[key]} (a mixture of experts) is not supported by the "
                                      f"native backend for model_type {raw.get('model_type')!r}; load it with "
                                      f"metagen.models.TransformersModel instead")
    if moe:  # every layer sparse, softmax routing, a shared expert only where the family has one
        for key, allowed in (("decoder_sparse_step", 1), ("mlp_only_layers", []), ("shared_expert_intermediate_size", 0),
                             ("first_k_dense_replace", 0), ("moe_layer_freq", 1), ("n_shared_experts", 0)):
            if shared_expert and key == "shared_expert_intermediate_size":
                continue  # Qwen2-MoE's shared expert
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
    """The MLP gate's activation: Gemma's `hidden_activation`, else `hidden_act`, else the family's."""
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
