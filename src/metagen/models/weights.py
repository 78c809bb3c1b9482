"""Canonical weight sources: what both checkpoint readers return, and the RoPE row order.

The readers (`gguf_reader.py` for GGUF files, `hf_reader.py` for HF safetensors directories) return
a `ModelConfig` and a dict of `WeightSource`s under one naming scheme: `embed`, `norm`, `lm_head`,
`rope_freqs` and `layers.{i}.{name}` for the canonical names of the checkpoint's family
(`models/families/`: attn_norm, q, k, v, q_bias, ..., or fused qkv and gate_up; a mixture of
experts has `router` and `experts.{e}.gate` / `.up` / `.down` per expert, split out of stacked
(E, rows, in) tensors where the file stores them so). Weights of linear layers are
`(out_features, in_features)` with Q/K rows (and q/k norm weights) permuted into the
interleaved-pair order of `layer.apply_rope` (`rotary_row_order`). RMSNorm weights are returned
as the layer multiplies by them: a (1 + w) family's HF weights get their 1 when read
(`Family.hf_norm_offset`); its GGUF files already hold 1 + w.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from metagen.models.config import ModelConfig


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
    norms, a fused qkv) of `rows` rows; None for other tensors."""
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
