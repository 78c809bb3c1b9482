"""Exact int4 codes of GGUF's 4-bit block formats, in the int4 kernel's group-32 layout.

The CPU int4 kernel computes, per group of 32 input features, w = (q − 8)·scale + zero with
q ∈ [0, 15]. Three GGUF formats are exactly this (up to the kernel's bf16 scales and zeros):

- Q4_0 block, 18 bytes = 32 weights: d (fp16), 16 bytes of nibbles; w = d·(q − 8)
  -> scale d, zero 0.
- Q4_1 block, 20 bytes = 32 weights: d, m (fp16), 16 bytes of nibbles; w = d·q + m
  -> scale d, zero m + 8d.
- Q4_K super-block, 144 bytes = 256 weights: d, dmin (fp16), 12 bytes holding eight 6-bit
  sub-block scales sc_j and mins m_j, 128 bytes of nibbles; sub-block j (32 weights) has
  w = d·sc_j·q − dmin·m_j  -> scale d·sc_j, zero 8·d·sc_j − dmin·m_j  (ggml's
  dequantize_row_q4_K).

Nibble order: in Q4_0/Q4_1 weight i < 16 is the low nibble of byte i and weight i ≥ 16 the high
nibble of byte i − 16; in Q4_K each 64 weights share 32 bytes, the first 32 in the low nibbles
and the next 32 in the high ones. Every function returns (codes (N, K) int32, scales (N, K/32),
zeros (N, K/32)) in float32. Cost: O(N·K) numpy ops, once at conversion.
"""

from __future__ import annotations

import numpy as np

EXACT_INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")


def _fp16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte `offset` of every block, as float32.  blocks: (N, B, bytes) -> (N, B)."""
    return blocks[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _q4_legacy(raw: np.ndarray, with_min: bool):
    header = 4 if with_min else 2
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, header + 16)  # (N, K/32, bytes)
    d = _fp16(blocks, 0)
    zeros = _fp16(blocks, 2) + 8.0 * d if with_min else np.zeros_like(d)
    qs = blocks[..., header:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)
    return codes.astype(np.int32), d, zeros


def _q4_k_scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eight 6-bit scales and mins from ggml's 12-byte packing.  packed: (N, B, 12) -> 2 × (N, B, 8).

    j < 4: sc = s[j] & 63, m = s[j+4] & 63; j ≥ 4: the low 4 bits from s[j+4] (sc: low nibble,
    m: high nibble), the top 2 bits from the top of s[j−4] (sc) and s[j] (m).
    """
    s = packed.astype(np.uint16)
    low_sc, low_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    high_sc = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    high_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return np.concatenate([low_sc, high_sc], -1), np.concatenate([low_m, high_m], -1)


def _q4_k(raw: np.ndarray):
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 144)  # (N, K/256, 144)
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    sc, m = _q4_k_scales_and_mins(blocks[..., 4:16])
    scales = d[..., None] * sc  # (N, K/256, 8)
    zeros = 8.0 * scales - dmin[..., None] * m
    qs = blocks[..., 16:].reshape(rows, -1, 4, 32)  # four chunks of 64 weights
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3)  # (N, K/256, 4, 2, 32): low then high nibbles
    return codes.reshape(rows, -1).astype(np.int32), scales.reshape(rows, -1), zeros.reshape(rows, -1)


def int4_codes(raw: np.ndarray, type_name: str):
    """(codes, scales, zeros) for a 4-bit GGUF tensor whose blocks the kernel reproduces, else None.

    raw: (N, bytes per row) uint8, as gguf's reader gives quantized tensors.
    """
    if type_name == "Q4_0":
        return _q4_legacy(raw, with_min=False)
    if type_name == "Q4_1":
        return _q4_legacy(raw, with_min=True)
    if type_name == "Q4_K":
        return _q4_k(raw)
    return None
