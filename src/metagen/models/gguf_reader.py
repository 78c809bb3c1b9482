"""The GGUF reader: a llama.cpp GGUF file -> `ModelConfig` + canonical `WeightSource`s.

Metadata keys are llama.cpp's (`{arch}.block_count`, `{arch}.attention.head_count`, ...), read
under the file's `general.architecture`; the family (`families.family_for_gguf`, by architecture
and whether the file carries experts) says what the file does not: its tensor names, its
defaults, whether its Q/K rows are in rotate-half order (permuted here into interleaved pairs,
`weights.rotary_row_order`). Quantized tensors keep their packed blocks (`WeightSource.raw`), so
the exact int4 and grouped kernels can take them as stored.

What the native backend does not implement is refused by name before any tensor is read: an
unknown architecture, logit soft-capping, longrope scaling (`rope_factors_long`) and the RoPE
scalings `rope.check_rope_scaling` refuses, partial rotary embeddings, and mixtures of experts of
another shape (more shared experts than the family has, leading dense blocks, scaled expert
weights, a gating function other than softmax).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from metagen.models.config import ModelConfig, pattern_layer_types
from metagen.models.families import family_for_gguf
from metagen.models.families.family import Family
from metagen.models.rope import check_rope_scaling
from metagen.models.weights import WeightSource, rotary_row_order

_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}


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
    if family.window_pattern is not None:  # local / global layers, as llama.cpp's loader sets them
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
        # A file without an expert length sizes each expert by the feed-forward length.
        moe_intermediate_size=int(field(f"{arch}.expert_feed_forward_length", 0)
                                  or field(f"{arch}.feed_forward_length", 0)),
        # The file's expert_weights_norm when it sets one, else what llama.cpp's graph does.
        norm_topk_prob=family.always_normalize or bool(field(f"{arch}.expert_weights_norm", family.gguf_norm_topk)),
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
        # llama.cpp's converter interleaves some families' Q/K already; rotate-half ones need permuting.
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
