"""Checkpoint readers: GGUF files and HF safetensors directories -> config + weight sources.

Both readers return a `ModelConfig` and a dict of `WeightSource`s under one naming scheme:
`embed`, `norm`, `lm_head`, `rope_freqs` and `layers.{i}.{attn_norm, q, k, v, o, q_bias, k_bias,
v_bias, mlp_norm, gate, up, down}`. Weights of linear layers are `(out_features, in_features)`
with Q/K rows in the HF (rotate-half) order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from metagen.models.config import ModelConfig

_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "attn_output.weight": "o",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}
_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.o_proj.weight": "o",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}
_HF_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


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


def interleave_rows(num_rows: int, num_heads: int) -> np.ndarray:
    """Row order taking rotate-half Q/K rows (HF, NEOX) to interleaved pairs (llama.cpp).

    Target row (h, i, j), i < D/2, j < 2, comes from source row (h, j, i): for each target row
    we return its source row.
    """
    head_dim = num_rows // num_heads
    source = np.arange(num_rows).reshape(num_heads, 2, head_dim // 2)
    return np.ascontiguousarray(source.transpose(0, 2, 1)).reshape(-1)


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

    def field(key: str, default=None):
        entry = reader.fields.get(key)
        return default if entry is None else entry.contents()

    def required(key: str):
        value = field(key)
        if value is None:
            raise ValueError(f"{path} lacks the GGUF metadata field {key!r}")
        return value

    arch = field("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(
            f"GGUF architecture {arch!r} is not supported by the native backend "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}); load it through transformers instead"
        )
    heads = int(required(f"{arch}.attention.head_count"))
    kv_heads = int(field(f"{arch}.attention.head_count_kv", heads))
    hidden = int(required(f"{arch}.embedding_length"))
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path} has no token_embd.weight tensor")
    vocab = int(field(f"{arch}.vocab_size", int(embed.shape[1])))
    rope_scaling = None
    scaling_type = field(f"{arch}.rope.scaling.type")
    if scaling_type and scaling_type != "none":
        rope_scaling = {"rope_type": scaling_type, "factor": float(field(f"{arch}.rope.scaling.factor", 1.0))}
        original = field(f"{arch}.rope.scaling.original_context_length")
        if original:
            rope_scaling["original_max_position_embeddings"] = int(original)
    config = ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(required(f"{arch}.feed_forward_length")),
        num_hidden_layers=int(required(f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(field(f"{arch}.attention.key_length", field(f"{arch}.rope.dimension_count", hidden // heads))),
        max_position_embeddings=int(field(f"{arch}.context_length", 4096)),
        rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        name=str(field("general.name", Path(path).stem)),
    )
    # llama.cpp already stores Llama-style Q/K interleaved; NEOX-style (Qwen2) needs permuting.
    neox = arch not in ("llama", "mistral")
    sources: dict[str, WeightSource] = {}
    for tensor in reader.tensors:
        if tensor.name in _GGUF_GLOBAL_NAMES:
            key = _GGUF_GLOBAL_NAMES[tensor.name]
        else:
            parts = tensor.name.split(".", 2)
            if parts[0] != "blk" or parts[2] not in _GGUF_LAYER_NAMES:
                continue
            key = f"layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
        qtype = tensor.tensor_type
        if qtype.name in ("F32", "F16", "BF16"):
            array = np.asarray(tensor.data)
            if qtype.name == "BF16":
                array = (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            shape = tuple(int(s) for s in reversed(tensor.shape))
            source = WeightSource(key, dense_tensor=torch.from_numpy(np.array(array, dtype=np.float32).reshape(shape)))
        else:
            source = WeightSource(key, raw=np.asarray(tensor.data), qtype=qtype)
        if neox and key.rsplit(".", 1)[-1] in ("q", "k", "q_bias", "k_bias"):
            rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else int(tensor.shape[0])
            source.row_order = interleave_rows(rows, heads if key.endswith(("q", "q_bias")) else kv_heads)
        sources[key] = source
    return config, sources, reader


def read_hf_directory(path: str | Path) -> tuple[ModelConfig, dict[str, WeightSource]]:
    """Config and weight sources from an HF directory (config.json + *.safetensors)."""
    from safetensors import safe_open

    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected an HF model directory or a .gguf file")
    raw = _read_json_object(config_path)
    arch = raw.get("model_type", "llama")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(
            f"model_type {arch!r} is not supported by the native backend (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}); use metagen.models.TransformersModel instead"
        )

    def positive(key: str, default=None) -> int:
        return _positive_int(raw, key, config_path, default)

    heads = positive("num_attention_heads")
    # transformers >= 5 writes RoPE settings as one `rope_parameters` dict; older files use
    # top-level `rope_theta` and `rope_scaling`.
    rope = dict(raw.get("rope_parameters") or {})
    rope_theta = raw.get("rope_theta", rope.pop("rope_theta", 10000.0))
    rope_scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    config = ModelConfig(
        architecture=arch,
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
        attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
        name=path.name,
    )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors files")
    sources: dict[str, WeightSource] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name in _HF_GLOBAL_NAMES:
                    key = _HF_GLOBAL_NAMES[name]
                elif name.startswith("model.layers."):
                    _, _, index, rest = name.split(".", 3)
                    if rest not in _HF_LAYER_NAMES:
                        continue
                    key = f"layers.{index}.{_HF_LAYER_NAMES[rest]}"
                else:
                    continue
                source = WeightSource(key, dense_tensor=handle.get_tensor(name))
                if key.rsplit(".", 1)[-1] in ("q", "k", "q_bias", "k_bias"):
                    kv = config.num_key_value_heads
                    source.row_order = interleave_rows(
                        source.dense_tensor.shape[0], heads if key.endswith(("q", "q_bias")) else kv
                    )
                sources[key] = source
    if config.tie_word_embeddings or "lm_head" not in sources:
        sources.pop("lm_head", None)
        config = ModelConfig(**{**config.__dict__, "tie_word_embeddings": True})
    return config, sources


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
