"""Weight layouts: the compiled kernels' packed formats (models/kernels/matmul.cpp) and torch's
CPU int4 layout, each with its inverse, and `Factored`, the K-quants' two-level group values.

Columns in tiles of 16, features in blocks of 32; a 64-byte chunk holds 16 columns × 4 features.
int8: 512 bytes per tile and block; int4: 320 (256 of nibbles, 16 bf16 scales, 16 bf16 zeros);
grouped (4-, 5-, 6-, 8-bit codes): `pack_grouped`. Every function is pure tensor code, O(N·K).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

FACTOR_SPAN = 256  # input features under one top value of a `Factored` scale or zero


class Factored:
    """Per-group values stored in two levels, as GGUF's K-quants store their sub-block scales and
    mins: v = fl(top · sub) in float32, `sub` (N, K/group) int8 per group, `top` (N, K/256) float
    per 256 input features. Q4_K / Q5_K: scale d·sc and zero −dmin·m with 6-bit sc, m; Q6_K:
    scale d·sc with int8 sc. One byte per group instead of a float: Q6_K's 6-bit codes take 0.82
    bytes per weight instead of 1.0, Q4_K's 0.58 instead of 0.625."""

    def __init__(self, top: torch.Tensor, sub: torch.Tensor) -> None:
        if top.dim() != 2 or sub.dim() != 2 or top.shape[0] != sub.shape[0] or sub.shape[1] % max(top.shape[1], 1):
            raise ValueError(f"Factored: top (N, K/256) and sub (N, K/group) with the same N, got {tuple(top.shape)} "
                             f"and {tuple(sub.shape)}")
        as_float = sub.float()
        if sub.numel() and ((as_float.round() != as_float).any() or as_float.min() < -128 or as_float.max() > 127):
            raise ValueError("Factored: sub values must be integers in [-128, 127] (int8)")
        self.top, self.sub = top, sub.to(torch.int8)

    @property
    def shape(self) -> torch.Size:
        return self.sub.shape

    def values(self) -> torch.Tensor:
        """(N, K/group) float32: fl(top · sub)."""
        per = self.sub.shape[1] // self.top.shape[1]
        return self.top.float().repeat_interleave(per, dim=1) * self.sub.float()


def pack_int4(codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """codes (N, K) in [0, 15], scales_and_zeros (K/32, N, 2) bf16 -> the int4 kernel layout.

    Per tile t and block g, 320 bytes: chunk c ∈ 0..3, byte 4j + b = q[16t + j, 32g + 4c + b] |
    q[16t + j, 32g + 16 + 4c + b] << 4; then the 16 scales and the 16 zeros (bf16)."""
    n, k = codes.shape
    tiles, blocks = n // 16, k // 32
    q = codes.to(torch.uint8).view(tiles, 16, blocks, 2, 4, 4)  # (t, j, g, half, c, b)
    nibbles = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 256)
    scales = scales_and_zeros[..., 0].reshape(blocks, tiles, 16).transpose(0, 1).contiguous().view(torch.uint8)
    zeros = scales_and_zeros[..., 1].reshape(blocks, tiles, 16).transpose(0, 1).contiguous().view(torch.uint8)
    return torch.cat([nibbles, scales, zeros], dim=-1).contiguous().view(-1)


def unpack_int4(weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int32 codes of an int4 kernel-layout weight (inverse of pack_int4)."""
    tiles, blocks = n // 16, k // 32
    nibbles = weight.view(tiles, blocks, 320)[..., :256].reshape(tiles, blocks, 4, 16, 4)  # (t, g, c, j, b)
    halves = torch.stack([nibbles & 15, nibbles >> 4], dim=2)  # (t, g, half, c, j, b)
    return halves.permute(0, 4, 1, 2, 3, 5).reshape(n, k).to(torch.int32)


def pack_int8(qweight: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 -> the int8 kernel layout: N padded to 16 and K to 32 with zero codes, per
    tile t and block g 512 bytes, chunk c ∈ 0..7, byte 4j + b = q[16t + j, 32g + 4c + b] + 128."""
    n, k = qweight.shape
    tiles, blocks = -(-n // 16), -(-k // 32)
    padded = F.pad(qweight.to(torch.int16), (0, blocks * 32 - k, 0, tiles * 16 - n)) + 128
    q = padded.to(torch.uint8).view(tiles, 16, blocks, 8, 4)  # (t, j, g, c, b)
    return q.permute(0, 2, 3, 1, 4).contiguous().view(-1)


def unpack_int8(weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int8 codes of an int8 kernel-layout weight (inverse of pack_int8)."""
    tiles, blocks = -(-n // 16), -(-k // 32)
    q = weight.view(tiles, blocks, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(tiles * 16, blocks * 32)
    return (q[:n, :k].to(torch.int16) - 128).to(torch.int8)


def _grouped_values(values: torch.Tensor, tiles: int, blocks: int) -> torch.Tensor:
    """(N, K/g) fp16 / fp32 -> (tiles, blocks, bytes): per block its groups' 16 values each."""
    n = values.shape[0]
    padded = F.pad(values, (0, 0, 0, tiles * 16 - n))
    per_block = padded.shape[1] // blocks
    v = padded.view(tiles, 16, blocks, per_block).permute(0, 2, 3, 1).contiguous()
    return v.view(torch.uint8).reshape(tiles, blocks, -1)


def pack_grouped(codes: torch.Tensor, scales: torch.Tensor | Factored, zeros: torch.Tensor | Factored | None, bits: int,
                 group: int) -> torch.Tensor:
    """codes (N, K) in [0, 2^bits), scales / zeros (N, K/group) fp16 or fp32 -> the grouped kernel
    layout (kernels/matmul.cpp): N padded to 16 (codes 128 for 8 bits, else 0; scales 0). Per
    tile t and block g: 8-bit: 8 chunks × 64 bytes, byte 4j + b of chunk c = u[16t + j, 32g + 4c + b];
    5 / 6 bits: int4's 256 bytes of low nibbles, then 64-byte planes of the high bits laid out like
    a chunk: 5 bits, bit c of byte 4j + b = bit 4 of u[16t + j, 32g + 4c + b]; 6 bits, two planes
    (chunks 0-3, 4-7) holding bits 4-5 of chunk c's code at bits 2(c mod 4), +1; 4 bits: the
    nibbles alone; then the scales (and zeros). Factored values: the int8 subs per block, and
    every 8 blocks preceded by the 16 columns' top scales (and zeros)."""
    n, k = codes.shape
    tiles, blocks = -(-n // 16), k // 32
    u = F.pad(codes.to(torch.int32), (0, 0, 0, tiles * 16 - n), value=128 if bits == 8 else 0).to(torch.uint8)
    chunks = u.view(tiles, 16, blocks, 8, 4).permute(0, 2, 3, 1, 4)  # (t, g, c, j, b)
    if bits == 8:
        parts = [chunks.reshape(tiles, blocks, 512)]
    elif bits == 4:
        parts = [(chunks[:, :, :4] | (chunks[:, :, 4:] << 4)).reshape(tiles, blocks, 256)]
    else:
        low = chunks[:, :, :4] & 15
        high = chunks[:, :, 4:] & 15
        parts = [(low | (high << 4)).reshape(tiles, blocks, 256)]
        high = (chunks.to(torch.int32) >> 4).reshape(tiles, blocks, 8, 64)  # (t, g, c, lane)
        if bits == 5:  # one plane: bit c of lane byte = bit 4 of chunk c's code
            planes = [(high << torch.arange(8, dtype=torch.int32)[:, None]).sum(2)]
        else:  # two planes (chunks 0-3, 4-7): bits 2c', 2c' + 1 = bits 4, 5 of chunk 4p + c'
            shifts = (2 * torch.arange(4, dtype=torch.int32))[:, None]
            planes = [(high[:, :, 4 * p : 4 * p + 4] << shifts).sum(2) for p in range(2)]
        parts += [plane.to(torch.uint8) for plane in planes]
    values = [v for v in (scales, zeros) if v is not None]
    if not isinstance(scales, Factored):
        return torch.cat(parts + [_grouped_values(v, tiles, blocks) for v in values], dim=-1).contiguous().view(-1)
    supers = blocks // 8
    per_block = torch.cat(parts + [_grouped_values(v.sub, tiles, blocks) for v in values], dim=-1)
    tops = torch.cat([_grouped_values(v.top, tiles, supers) for v in values], dim=-1)
    return torch.cat([tops, per_block.reshape(tiles, supers, -1)], dim=-1).contiguous().view(-1)


def unpack_grouped(weight: torch.Tensor, n: int, k: int, bits: int, group: int, half: bool, zero: bool,
                   factored: bool = False) -> torch.Tensor:
    """The (N, K) uint8 codes of a grouped kernel-layout weight (inverse of pack_grouped)."""
    tiles, blocks = -(-n // 16), k // 32
    code_bytes = 512 if bits == 8 else 256 + (bits - 4) * 64
    value_bytes = (32 // group) * 16 * (1 if factored else 2 if half else 4)
    block_bytes = code_bytes + value_bytes * (2 if zero else 1)
    if factored:
        top_bytes = 16 * (2 if half else 4) * (2 if zero else 1)
        b = weight.view(tiles, blocks // 8, top_bytes + 8 * block_bytes)[..., top_bytes:].reshape(tiles, blocks, block_bytes)
    else:
        b = weight.view(tiles, blocks, block_bytes)
    if bits == 8:
        chunks = b[..., :512].reshape(tiles, blocks, 8, 16, 4)
    elif bits == 4:
        nibbles = b[..., :256].reshape(tiles, blocks, 4, 16, 4)
        chunks = torch.cat([nibbles & 15, nibbles >> 4], dim=2)
    else:
        nibbles = b[..., :256].reshape(tiles, blocks, 4, 16, 4)
        chunks = torch.cat([nibbles & 15, nibbles >> 4], dim=2).to(torch.int32)  # (t, g, c, j, b)
        planes = b[..., 256 : 256 + 64 * (bits - 4)].reshape(tiles, blocks, bits - 4, 1, 64).to(torch.int32)
        if bits == 5:
            high = (planes[:, :, 0] >> torch.arange(8, dtype=torch.int32)[:, None]) & 1  # (t, g, c, lane)
        else:
            high = ((planes >> (2 * torch.arange(4, dtype=torch.int32))[:, None]) & 3).reshape(tiles, blocks, 8, 64)
        chunks = chunks | (high.reshape(tiles, blocks, 8, 16, 4) << 4)
        chunks = chunks.to(torch.uint8)
    return chunks.permute(0, 3, 1, 2, 4).reshape(tiles * 16, k)[:n].contiguous()


def unpack_torch_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (N, K) int32 codes of torch's CPU int4 layout: rows in blocks of B (64 where torch's
    kernels use AVX-512, 32 with AVX2: `_torch_int4_block`), each block (K, B/2) bytes with row j
    in the low and row B/2 + j in the high nibble; a last block of fewer rows holds rows 2j and
    2j + 1 in byte j."""
    size = _torch_int4_block()
    flat = packed.view(-1)
    full = n // size * size  # the rows in whole blocks, all at once
    blocks = flat[: full * k // 2].view(n // size, k, size // 2)
    low, high = (blocks & 15).to(torch.int32), (blocks >> 4).to(torch.int32)
    out = [torch.cat([low, high], dim=2).transpose(1, 2).reshape(full, k)]
    if full < n:
        block = flat[full * k // 2 :].view(k, (n - full) // 2)
        low, high = (block & 15).to(torch.int32), (block >> 4).to(torch.int32)
        out.append(torch.stack([low, high], dim=2).reshape(k, n - full).t())
    return torch.cat(out).contiguous()


@functools.lru_cache(maxsize=1)
def _torch_int4_block() -> int:
    """The rows per block of torch's CPU int4 layout on this machine: its packing kernel is
    compiled per ISA (64 rows with AVX-512, 32 with AVX2), so it is read off a probe of 64 rows
    packed once and unpacked each known way. RuntimeError if none gives the codes back."""
    k = 32
    codes = torch.randint(0, 16, (64, k), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    flat = torch_int4_pack(codes).view(-1)
    for size in (64, 32, 16):
        blocks = flat.view(64 // size, k, size // 2)
        unpacked = torch.cat([blocks & 15, blocks >> 4], dim=2).to(torch.int32).transpose(1, 2).reshape(64, k)
        if torch.equal(unpacked, codes):
            return size
    raise RuntimeError("torch's CPU int4 layout on this machine is none of the known ones (blocks of 64, 32 or 16 "
                       "rows): metagen cannot read int4 weights packed by torch here")


def torch_int4_pack(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes in [0, 15] -> torch's CPU int4 layout (`aten._convert_weight_to_int4pack_for_cpu`)."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
