"""Shared-prefix (cascade) attention for rows that share a cached prefix (Hydragen).

Rows forked from one prompt (`KVCache.select` / `fork`) hold the same slot ids for the prompt's
positions. Attending row by row reads the prompt's keys and values once per row, as R
matrix-vector products; here each group of rows sharing a prefix reads it once for all their
queries, as one matrix-matrix product `(R·Tq·G × D)·(D × P)` per kv head, and each row reads only
its own suffix. The two parts are combined exactly by their log-sum-exps (Juravsky et al., 2024,
"Hydragen: High-Throughput LLM Inference with Shared Prefixes"):

    lse_i = log Σ_{t ∈ part i} e^{s_t},   o_i = Σ_{t ∈ part i} e^{s_t − lse_i} v_t
    o = e^{lse_1 − lse} o_1 + e^{lse_2 − lse} o_2,   lse = log(e^{lse_1} + e^{lse_2})

which is softmax attention over the union of the parts, up to float rounding.

A row in no group appending several tokens (a speculative verification's γ + 1) is a group of
its own when its new tokens × cached keys reach `OWN_PREFIX_MIN_QUERY_KEYS` (2048): the prefix
kernel reads each of its keys once for all its queries and the heads of a kv head, as blocks of
matrix-matrix products, where the row-by-row kernel reads it per query with one dot product per
head. Whole SmolLM2 steps, split / row by row, alternating in one process: 5 tokens over 1000
keys 20.2 / 24.8 ms, over 128 keys 20.4 / 20.0; 2 tokens over 1000 keys 15.5 / 15.3, over 128
keys 11.0 / 9.3; one token over 1000 keys 14.0 / 11.7 (so one token stays row by row). One
Qwen2.5-Coder-1.5B layer (12 heads, 2 kv heads, D = 128), 5 tokens over 1000 keys: 2.6 ms row by
row before the D = 128 dot product got its 32 lanes, 1.04 ms after, 0.30 ms split (kernels
alone, random keys: 5 tokens over 128 keys 154 / 53 µs; SmolLM2 62 / 32 µs).

Detection (`find_shared_prefixes`, once per step from the page table, O(B·P) integer compares):
rows are grouped by their first slot; a group's prefix is its rows' longest common run of slot
ids (bounded by the shortest row's cached length). One level only: rows that share a prompt and
then a second, longer prefix among a few of them (a tree) split at the common part. A group is
split when its prefix has at least `SHARED_PREFIX_MIN_KEYS` keys and its queries × prefix keys
reach `SHARED_PREFIX_MIN_QUERY_KEYS`; below that the extra kernel calls and the combine cost more
than the reads they save. Measured per layer (SmolLM2: 9 heads, 3 kv heads, D = 64; one thread,
CPU time, split / unsplit; 16 own keys per row): 2 rows 0.96 at 64 keys, 0.78 at 128, 0.62 at
512; 4 rows 1.11 at 32, 0.70 at 64, 0.45 at 512; 16 rows 0.85 at 32, 0.52 at 64, 0.31 at 512.

The switch: `DecoderModel.use_shared_prefix` (default from `METAGEN_SHARED_PREFIX`, "1" on,
"0" off). Only the fused decode path splits (the general path, prefill, always attends row by
row); a sliding-window layer whose window cuts into some query's keys attends unsplit. Every
KV format splits: bf16 and int8 keys and values are widened (int8 times its scale) as they are
read, as in the unsplit kernel.
"""

from __future__ import annotations

import os

import numpy as np
import torch

# Shortest shared prefix (keys) worth a separate pass, and the least queries × prefix keys of a
# group (2 rows from 128 keys, 4 or more from 64): smaller ones attend unsplit.
SHARED_PREFIX_MIN_KEYS = 64
SHARED_PREFIX_MIN_QUERY_KEYS = 256
# A row of its own (no group) appending several tokens splits from this many new tokens × cached
# keys (the module docstring has the measurements).
OWN_PREFIX_MIN_QUERY_KEYS = 2048


def shared_prefix_default() -> bool:
    """METAGEN_SHARED_PREFIX: "1" (default) splits shared prefixes, "0" attends row by row."""
    value = os.environ.get("METAGEN_SHARED_PREFIX", "1")
    if value not in ("0", "1"):
        raise ValueError(f"METAGEN_SHARED_PREFIX={value!r} is not supported: use '1' (split shared prefixes, "
                         f"the default) or '0' (attend row by row)")
    return value == "1"


def find_shared_prefixes(table: np.ndarray, lengths: np.ndarray, min_keys: int = SHARED_PREFIX_MIN_KEYS
                         ) -> list[tuple[np.ndarray, int]]:
    """Groups of rows sharing a cached prefix: [(rows (R,) int64, prefix length P)], R ≥ 2 and
    P ≥ min_keys, each row in one group at most.

    table: (B, T) int64 page table; lengths: (B,) cached tokens per row before this step's
    appends (the prefix never reaches a new token). O(B·P)."""
    candidates = np.nonzero(lengths >= min_keys)[0]
    if candidates.size < 2:
        return []
    firsts, inverse, counts = np.unique(table[candidates, 0], return_inverse=True, return_counts=True)
    groups = []
    for index in np.nonzero(counts >= 2)[0]:
        rows = candidates[inverse == index]
        limit = int(lengths[rows].min())
        block = table[rows, :limit]
        differs = (block != block[0]).any(axis=0)  # (limit,)
        prefix = int(differs.argmax()) if differs.any() else limit
        if prefix >= min_keys:
            groups.append((rows, prefix))
    return groups


class SharedPrefixPlan:
    """One step's split: the prefixes' slots and their queries as the kernel takes them, and each
    query's suffix start.

    prefix_slots (ΣP,), prefix_offsets (G + 1,), query_index (ΣM,) (packed query rows of each
    group), query_offsets (G + 1,), suffix_starts (N,) (the group's P for grouped queries, 0 for
    the others), all int64."""

    def __init__(self, groups: list[tuple[np.ndarray, int]], table: np.ndarray, counts: np.ndarray) -> None:
        first_query = np.concatenate(([0], np.cumsum(counts)))  # packed queries of row b: first_query[b]..
        suffix_starts = np.zeros(int(first_query[-1]), dtype=np.int64)
        slots, queries = [], []
        prefix_offsets, query_offsets = [0], [0]
        for rows, prefix in groups:
            slots.append(table[rows[0], :prefix])
            index = np.concatenate([np.arange(first_query[b], first_query[b + 1]) for b in rows])
            queries.append(index)
            suffix_starts[index] = prefix
            prefix_offsets.append(prefix_offsets[-1] + prefix)
            query_offsets.append(query_offsets[-1] + index.size)
        self.prefix_slots = torch.from_numpy(np.concatenate(slots).astype(np.int64))
        self.prefix_offsets = torch.tensor(prefix_offsets, dtype=torch.int64)
        self.query_index = torch.from_numpy(np.concatenate(queries).astype(np.int64))
        self.query_offsets = torch.tensor(query_offsets, dtype=torch.int64)
        self.suffix_starts = torch.from_numpy(suffix_starts)
        self.groups = groups

    @classmethod
    def of_step(cls, table: torch.Tensor, positions: torch.Tensor, counts: np.ndarray,
                min_keys: int = SHARED_PREFIX_MIN_KEYS) -> SharedPrefixPlan | None:
        """The plan for a step appending `counts (B,)` tokens at `positions (B, T_q)` with page
        table `table (B, T_kv)`, or None when no group shares a prefix worth splitting (see the
        module docstring)."""
        if table.shape[0] < 2 and counts[0] < 2:  # one row decoding one token: nothing to share
            return None
        lengths = positions[:, 0].numpy()  # cached keys of each row before this step
        table_np = table.numpy()
        groups = [(rows, prefix) for rows, prefix in find_shared_prefixes(table_np, lengths, min_keys)
                  if int(counts[rows].sum()) * prefix >= SHARED_PREFIX_MIN_QUERY_KEYS]
        # A row in no group appending several tokens (a speculative verification) reads its own
        # cached keys through the same kernel when its queries × keys pay: each key is read once
        # for all its queries and the heads of a kv head. (One new token over a long context
        # measured slower this way: 14.0 vs 11.7 ms per SmolLM2 step at 1000 keys.)
        grouped = np.zeros(len(counts), dtype=bool)
        for rows, _ in groups:
            grouped[rows] = True
        pays = (counts >= 2) & (lengths >= min_keys) & (counts * lengths >= OWN_PREFIX_MIN_QUERY_KEYS)
        for row in np.nonzero(~grouped & pays)[0]:
            groups.append((np.array([row]), int(lengths[row])))
        return cls(groups, table_np, counts) if groups else None

    def attend(self, kernels, q: torch.Tensor, pool: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
               scale: float, bf16_out: bool, scales: torch.Tensor | None = None, buffers=None,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the packed queries `q (N, H, D)` (query n reads `table[n, :lengths[n]]`)
        as prefix part + suffix part, combined by log-sum-exp. `pool` float32, bf16 or int8 (with
        its `scales`). Returns (N, H·D), bf16 when `bf16_out`, else float32: in `out` when given,
        the parts in `buffers` (a decoder.StepBuffers) when given."""
        parts = [None] * 4
        if buffers is not None:
            n, heads, dim = q.shape
            parts = [buffers.get(name, shape, torch.float32) for name, shape in (
                ("prefix_out", (n, heads, dim)), ("prefix_lse", (n, heads)),
                ("suffix_out", (n, heads, dim)), ("suffix_lse", (n, heads)))]
        prefix_out, prefix_lse = kernels.shared_prefix_attention(q, pool, self.prefix_slots, self.prefix_offsets,
                                                                 self.query_index, self.query_offsets, scale, scales,
                                                                 parts[0], parts[1])
        suffix_out, suffix_lse = kernels.paged_attention_part(q, pool, table, lengths, self.suffix_starts, scale,
                                                              scales, parts[2], parts[3])
        return kernels.combine_attention_parts(prefix_out, prefix_lse, suffix_out, suffix_lse, bf16_out, out)
