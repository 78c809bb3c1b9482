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
    exact = _q4_k_group(raw)  # w = d·sc·q − dmin·m = (q − 8)·s + (8·s + z)
    return exact.codes.astype(np.int32), exact.scales, 8.0 * exact.scales + exact.zeros


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


# ------------------------------------------------------------------ grouped blocks (4-, 5-, 6-, 8-bit)
# The grouped kernel (linear.GroupedLinear) computes w = (u − o)·s + z with unsigned codes u of
# 4, 5, 6 or 8 bits, one scale s (and zero z) per group of 16 or 32 input features. GGUF's
# blocks are exactly this, in float32 (ggml's own dequantization does the same products); the
# K-quants' s and z are products of an fp16 per 256 and a small integer per group, kept as such
# (`GroupCodes.factors`):
#
# - Q8_0, 34 bytes = 32 weights: d (fp16), 32 int8 q; w = d·q      -> u = q + 128, o = 128, s = d.
# - Q5_0, 22 bytes: d, 4 bytes qh, 16 bytes nibbles; the 5th bit of weight i is bit i of qh;
#   w = d·(q − 16)                                                   -> u = q, o = 16, s = d.
# - Q5_1, 24 bytes: d, m, qh, nibbles; w = d·q + m                   -> o = 0, s = d, z = m.
# - Q6_K, 210 bytes = 256 weights: 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8
#   sub-block scales sc, d; w = d·sc_j·(q − 32) per 16 weights       -> o = 32, s = d·sc_j (group 16).
# - Q5_K, 176 bytes = 256 weights: d, dmin, 12 bytes of 6-bit sc/m (as Q4_K), 32 bytes of 5th
#   bits, 128 bytes nibbles; w = d·sc_j·q − dmin·m_j per 32         -> o = 0, s = d·sc_j, z = −dmin·m_j.
# - Q4_K, as Q5_K without the 5th bits (see above)                  -> bits 4, o = 0, s = d·sc_j, z = −dmin·m_j.

GROUPED_TYPES = ("Q4_K", "Q5_0", "Q5_1", "Q8_0", "Q6_K", "Q5_K")


class GroupCodes:
    """A GGUF tensor's codes in the grouped kernel's terms: `codes` (N, K) uint8 u, `scales`
    (N, K/group) float32, `zeros` (N, K/group) float32 or None, `bits`, `group`, `offset` o:
    w = (u − o)·s (+ z). `factors`: for the K-quants, {"scales": (top, sub), "zeros": (top, sub)}
    with top (N, K/256) float32 (d, −dmin) and sub (N, K/group) int8 (sc, m): s = top·sub."""

    def __init__(self, codes, scales, zeros, bits: int, group: int, offset: int, factors: dict | None = None) -> None:
        self.codes, self.scales, self.zeros = codes, scales, zeros
        self.bits, self.group, self.offset = bits, group, offset
        self.factors = factors

    def take_rows(self, order: np.ndarray) -> None:
        """Reorder the output rows (in place)."""
        self.codes, self.scales = self.codes[order], self.scales[order]
        self.zeros = None if self.zeros is None else self.zeros[order]
        if self.factors is not None:
            self.factors = {name: (top[order], sub[order]) for name, (top, sub) in self.factors.items()}

    def dequantize(self) -> np.ndarray:
        """(N, K) float32 in ggml's order of operations."""
        scales = np.repeat(self.scales, self.group, axis=1)
        w = (self.codes.astype(np.float32) - np.float32(self.offset)) * scales
        return w if self.zeros is None else w + np.repeat(self.zeros, self.group, axis=1)


def _fifth_bits(qh_bytes: np.ndarray) -> np.ndarray:
    """(N, B, 4) bytes of a little-endian uint32 -> (N, B, 32) bits, bit i of weight i."""
    qh = qh_bytes.copy().view(np.uint32)  # (N, B, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_legacy(raw: np.ndarray, with_min: bool) -> GroupCodes:
    header = 4 if with_min else 2
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, header + 20)
    d = _fp16(blocks, 0)
    high = _fifth_bits(blocks[..., header : header + 4])
    qs = blocks[..., header + 4 :]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    codes = (low | (high << 4)).reshape(rows, -1)
    if with_min:
        return GroupCodes(codes, d, _fp16(blocks, 2), bits=5, group=32, offset=0)
    return GroupCodes(codes, d, None, bits=5, group=32, offset=16)


def _q8_0(raw: np.ndarray) -> GroupCodes | None:
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 34)
    q = blocks[..., 2:].copy().view(np.int8)
    if (q == -128).any():  # outside the symmetric range the kernel's AVX2 path takes
        return None
    codes = (q.astype(np.int16) + 128).astype(np.uint8).reshape(rows, -1)
    return GroupCodes(codes, _fp16(blocks, 0), None, bits=8, group=32, offset=128)


def _q6_k(raw: np.ndarray) -> GroupCodes:
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 210)
    nb = blocks.shape[1]
    ql, qh = blocks[..., :128], blocks[..., 128:192]
    sc = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)  # (N, B, 16)
    d = _fp16(blocks, 208)
    # Each half of 128 weights: 64 low-nibble bytes give weights 0..63 (low) and 64..127 (high);
    # 32 high bytes give 2 bits to weights 0..31, 32..63, 64..95, 96..127 (shifts 0, 2, 4, 6).
    low = ql.reshape(rows, nb, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    low = (low & 0x0F).reshape(rows, nb, 2, 128)
    high = qh.reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    high = (high & 0x03).reshape(rows, nb, 2, 128)
    codes = (low | (high << 4)).reshape(rows, -1)
    factors = {"scales": (d, sc.astype(np.int8).reshape(rows, -1))}
    return GroupCodes(codes, (d[..., None] * sc).reshape(rows, -1), None, bits=6, group=16, offset=32, factors=factors)


def _q5_k(raw: np.ndarray) -> GroupCodes:
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 176)
    nb = blocks.shape[1]
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    sc, m = _q4_k_scales_and_mins(blocks[..., 4:16])
    qh, qs = blocks[..., 16:48], blocks[..., 48:]
    low = qs.reshape(rows, nb, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    low = (low & 0x0F).reshape(rows, nb, 8, 32)  # sub-block j: low nibbles of chunk j/2, or high
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1  # bit j: sub-block j
    codes = (low | (high << 4)).reshape(rows, -1)
    return _k_codes(codes, d, dmin, sc, m, bits=5)


def _k_codes(codes, d, dmin, sc, m, bits: int) -> GroupCodes:
    """Q4_K / Q5_K: s = d·sc, z = −dmin·m per 32 (d, dmin: (N, K/256); sc, m: (N, K/256, 8))."""
    rows = codes.shape[0]
    scales = (d[..., None] * sc).reshape(rows, -1)
    zeros = -(dmin[..., None] * m).reshape(rows, -1)
    factors = {"scales": (d, sc.astype(np.int8).reshape(rows, -1)),
               "zeros": (-dmin, m.astype(np.int8).reshape(rows, -1))}
    return GroupCodes(codes, scales, zeros, bits=bits, group=32, offset=0, factors=factors)


def _q4_k_group(raw: np.ndarray) -> GroupCodes:
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 144)
    sc, m = _q4_k_scales_and_mins(blocks[..., 4:16])
    qs = blocks[..., 16:].reshape(rows, -1, 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1)
    return _k_codes(codes, _fp16(blocks, 0), _fp16(blocks, 2), sc, m, bits=4)


def group_codes(raw: np.ndarray, type_name: str) -> GroupCodes | None:
    """The grouped kernel's exact codes for a Q4_K, Q5_x, Q6_K or Q8_0 GGUF tensor, else None.

    raw: (N, bytes per row) uint8. None also for a Q8_0 tensor holding the code −128."""
    if type_name == "Q4_K":
        return _q4_k_group(raw)
    if type_name == "Q5_0":
        return _q5_legacy(raw, with_min=False)
    if type_name == "Q5_1":
        return _q5_legacy(raw, with_min=True)
    if type_name == "Q8_0":
        return _q8_0(raw)
    if type_name == "Q6_K":
        return _q6_k(raw)
    if type_name == "Q5_K":
        return _q5_k(raw)
    return None
