"""A paged key/value cache with token-granular pages and shared prefixes.

Every cached token occupies one *slot* of a per-layer pool `(S, 2, KVH, D)` (key and value). A row (one sequence)
is a list of slot ids — its page table — plus a length. Slots are written once and never
changed, so rows can share them freely:

- **fork / select**: new rows copy page-table entries (integers), not keys and values; a
  reference count per slot says how many rows use it. Forking a 1000-token prompt into 16 rows
  copies 16·1000 integers and no tensors.
- **truncate**: drop a row's tail entries and release slots nobody uses any more (speculative
  rejection, tree-search backtracking).
- **append several tokens**: the model writes one slot per new token, any number per row, rows
  of different lengths in one batch.
- **snapshot / restore**: a `RowSnapshot` keeps a row's slots alive outside the batch (one
  reference per slot); `restore` makes the batch any list of snapshots. Tree search keeps one
  snapshot per node and expands any set of nodes without recomputing their prefixes. `share`
  makes a snapshot of any slots in use (a prefix cache's edge, or a row from a cached prefix).

Attention gathers each row's keys and values through its page table (one `index_select` per
layer), which costs one read of what it attends to anyway. The pool grows by doubling when free slots run out.

**Element format** (`dtype`, the model's `kv_dtype`; see `KV_DTYPES`): float32 (default), bfloat16
(half the bytes per token; rounded to nearest even) or int8 with one float32 scale per
(slot, key/value, head) in `scales[layer] (S, 2, KVH)`: x̂ = q·s with s = max|x| / 127 and
q = round(x / s) (symmetric, per head; an all-zero head has s = 0). Bytes per token per layer:
2·KVH·D·4 (fp32), 2·KVH·D·2 (bf16), 2·KVH·(D + 4) (int8), so D = 64 stores 26.6% of fp32's.
Keys and values are rounded once, when written (`write`, or the fused `rope_store`), and read
back widened to float (`read` dequantizes the rows it gathers; the fused attention kernel widens
in its inner loop). Everything else (fork, truncate, snapshots, the prefix cache) moves slot ids
and never looks at the elements; `copy_prefix` copies elements and scales alike.

**Sliding window** (`window=W`, given when every layer attends only to the last W positions,
e.g. Mistral): a token at position p never reads a key older than p − W + 1, so when a row
grows, its slots older than its next query's window minus a margin of `keep` positions are
released (`released(row)` counts them; their page-table entries stay as stale ids that nothing
reads). The margin lets `truncate` roll a row back by up to `keep` tokens (speculative
rejection); a deeper roll-back is refused naming the window. A row then holds at most
W + 2·keep − 1 slots however long it grows: the pool stays bounded (the page table keeps one
int64 per position). A model with some global layers (Gemma 3) passes no window: its cache
releases nothing.

Arguments are checked before anything changes (`metagen.models.checks`): rows, lengths and counts
must be ints in range, and a snapshot is only accepted by the cache that made it (its slot ids
mean nothing in another cache's pools). TypeError / ValueError name the argument and the range.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from metagen.models import checks
from metagen.models.base import PagedCache

# KV dtype names (the `kv_dtype` option of `load` and --kv-dtype) -> the pools' element type.
KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}
DEFAULT_KV_DTYPE = "fp32"
INT8_LEVELS = 127  # symmetric int8: codes in [-127, 127]


def check_kv_dtype(kv_dtype: object, name: str = "kv_dtype") -> str:
    """`kv_dtype` when it names a KV format; ValueError naming `name` and the allowed values."""
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise ValueError(f"{name}={kv_dtype!r} is not supported: choose one of {', '.join(KV_DTYPES)}")
    return kv_dtype


def token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """Bytes one cached token takes over all layers in a cache of this shape: keys, values and
    (int8) their scales, layers · 2 · kv_heads · (head_dim · itemsize (+ a float32 scale)). The
    arithmetic behind each model's `kv_bytes_per_token`, the one name callers ask."""
    element = torch.empty(0, dtype=KV_DTYPES[check_kv_dtype(kv_dtype)]).element_size()
    scale = 4 if kv_dtype == "int8" else 0
    return num_layers * 2 * num_kv_heads * (head_dim * element + scale)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-head int8: `x (..., D)` float32 -> codes `(..., D)` int8 and scales `(...)`
    float32 with x ≈ codes · scales; s = max|x| / 127, q = round(x / s), an all-zero head s = 0.
    The same arithmetic as fused.cpp's `store_head`, so both give the same codes."""
    scales = x.abs().amax(-1) / INT8_LEVELS
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(x / divisor.unsqueeze(-1)).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return codes, scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes `(..., D)` int8, scales `(...)` -> `(..., D)` float32."""
    return codes.float() * scales.unsqueeze(-1)


class RowSnapshot:
    """A row's page table held outside the batch: `slots (length − start,)`, one reference each,
    for positions start.. (start > 0 only when a sliding-window cache released the older ones).

    Made by `KVCache.snapshot`; only that cache (`owner`) restores it, and `KVCache.release` gives
    the references back (once).
    """

    __slots__ = ("owner", "slots", "start")

    def __init__(self, slots: np.ndarray, owner: KVCache, start: int = 0) -> None:
        self.slots: np.ndarray | None = slots
        self.owner = owner
        self.start = start

    @property
    def released(self) -> bool:
        return self.slots is None

    @property
    def length(self) -> int:
        if self.slots is None:
            raise ValueError("this RowSnapshot was released")
        return self.start + int(self.slots.size)


class KVCache(PagedCache):
    """Key/value cache for a batch of rows over `num_layers` layers.

    Shapes: pools `(S, 2, KVH, D)` per layer in `dtype` (torch.float32, torch.bfloat16 or
    torch.int8, see the module docstring), with `scales (S, 2, KVH)` float32 per layer for int8;
    page table `(B, T_cap)` int64; lengths `(B,)`; starts `(B,)` (positions below a row's start
    were released by the sliding window; 0 without one).
    """

    # Positions kept behind the sliding window so `truncate` can roll a row back this far.
    DEFAULT_KEEP = 64

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        max_length: int,
        capacity: int = 1024,
        context_note: str = "",
        window: int | None = None,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        names = {torch_dtype: name for name, torch_dtype in KV_DTYPES.items()}
        if dtype not in names:
            raise ValueError(f"dtype={dtype!r} is not supported: choose one of "
                             f"{', '.join(str(d) for d in KV_DTYPES.values())} (kv_dtype {', '.join(KV_DTYPES)})")
        self.dtype = dtype
        self.kv_dtype = names[dtype]
        self.max_length = max_length
        self.context_note = context_note  # why max_length is what it is, appended to the error past it
        self.window = None if window is None else checks.bounded("window", window, 1)
        self.keep = checks.bounded("keep", keep, 0)
        self.pools: list[torch.Tensor] = []  # per layer, (S, 2, KVH, D)
        self.scales: list[torch.Tensor] = []  # per layer, (S, 2, KVH) float32; int8 pools only
        self._refcount = np.zeros(0, dtype=np.int32)
        self._free = np.zeros(0, dtype=np.int64)  # stack of free slot ids
        self._num_free = 0
        self._grow(max(capacity, 16))
        self._table = np.zeros((1, 64), dtype=np.int64)
        self._lengths = np.zeros(1, dtype=np.int64)
        self._starts = np.zeros(1, dtype=np.int64)

    # ------------------------------------------------------------------ rows
    @property
    def batch_size(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> list[int]:
        """Number of cached tokens per row."""
        return self._lengths.tolist()

    def length(self, row: int) -> int:
        return int(self._lengths[self._check_row(row)])

    def slots(self, row: int) -> np.ndarray:
        """Slot ids of a row's cached tokens, `(length,)` (a copy). ValueError when the sliding
        window released the row's oldest positions (see `released`)."""
        row = self._check_row(row)
        if self._starts[row]:
            raise ValueError(f"row {row} no longer holds its first {int(self._starts[row])} positions (they left "
                             f"the sliding window of {self.window} and were released)")
        return self._table[row, : self._lengths[row]].copy()

    def released(self, row: int) -> int:
        """How many of the row's oldest positions the sliding window released (0 without one)."""
        return int(self._starts[self._check_row(row)])

    def select(self, indices: Sequence[int]) -> None:
        """Make the rows `[rows[i] for i in indices]`; repeated indices share their prefix.

        Forking row r into n rows is `select([r] * n)`; beam search reorders with it; dropping
        finished rows is a select of the survivors. Copies page-table entries only. O(B·T) ints.
        """
        idx = checks.rows("indices", indices, self.batch_size)
        uses = np.bincount(idx, minlength=self.batch_size) - 1  # change in users of each old row
        for row in np.nonzero(uses)[0]:
            slots = self._table[row, self._starts[row] : self._lengths[row]]
            self._refcount[slots] += uses[row]
        dropped = self._slots_of_rows(np.nonzero(uses < 0)[0])
        self._push_free(dropped[self._refcount[dropped] == 0])
        self._table = self._table[idx] if idx.size else np.zeros((0, self._table.shape[1]), np.int64)
        self._lengths = self._lengths[idx]
        self._starts = self._starts[idx]

    def fork(self, row: int, n: int) -> list[int]:
        """Append `n` rows sharing `row`'s cached prefix; returns their row numbers."""
        row = self._check_row(row)
        n = checks.bounded("n", n, 0)
        first = self.batch_size
        self.select(list(range(first)) + [row] * n)
        return list(range(first, first + n))

    def truncate(self, row: int, length: int) -> None:
        """Keep the first `length` cached tokens of `row`, releasing the rest."""
        row = self._check_row(row)
        current = int(self._lengths[row])
        length = checks.bounded("length", length, 0, current)
        start = int(self._starts[row])
        if start and length - self.window + 1 < start:
            raise ValueError(f"length={length} is out of range for row {row}: its positions before {start} left the "
                             f"sliding window of {self.window} and were released, so it can be truncated to "
                             f"{start + self.window - 1} tokens at least")
        dropped = self._table[row, length:current]
        self._refcount[dropped] -= 1
        self._push_free(dropped[self._refcount[dropped] == 0])
        self._lengths[row] = length

    def keep_path(self, row: int, start: int, kept: Sequence[int]) -> None:
        """Keep the path `kept` of the tree appended to `row` at [start, length) and release the
        rest: page-table entries start + kept[d] move to start + d, and the row's length becomes
        start + len(kept).

        No K/V moves: slots are written once, and a path's node at depth d was stored rotated
        for position start + d (`models/token_tree.py`), where it lands. Slots shared with
        other rows or snapshots stay theirs. `kept`: increasing indices in [0, length − start)
        (parents are fed first); the cache does not know the tree, so indices that are not a
        root-to-node path leave keys at the wrong positions. O(length − start) ints.
        """
        row = self._check_row(row)
        current = int(self._lengths[row])
        start = checks.bounded("start", start, 0, current)
        indices = checks.increasing("kept", kept, current - start)
        length = start + indices.size
        lowest = int(self._starts[row])
        if lowest and start - self.window + 1 < lowest:
            raise ValueError(f"start={start} is out of range for row {row}: its positions before {lowest} left the "
                             f"sliding window of {self.window} and were released, so start must be at least "
                             f"{lowest + self.window - 1}")
        fed = self._table[row, start:current].copy()
        dropped = np.delete(fed, indices)
        self._table[row, start:length] = fed[indices]
        self._refcount[dropped] -= 1
        self._push_free(dropped[self._refcount[dropped] == 0])
        self._lengths[row] = length

    def snapshot(self, row: int) -> RowSnapshot:
        """Keep `row`'s cached prefix alive outside the batch (slot references, no K/V copy)."""
        row = self._check_row(row)
        start = int(self._starts[row])
        slots = self._table[row, start : self._lengths[row]].copy()
        self._refcount[slots] += 1
        return RowSnapshot(slots, self, start)

    def share(self, slots: Sequence[int]) -> RowSnapshot:
        """A snapshot of any slots in use, `slots (k,)`, taking one reference each: a row made
        from a cached prefix (`restore([cache.share(prefix_slots)])`), or a prefix cache keeping
        slots alive after their rows left. O(k) ints."""
        given = np.asarray(slots)
        if given.size and given.dtype.kind not in "iu":
            raise TypeError(f"slots must be integer slot ids, got an array of {given.dtype}")
        slots = given.astype(np.int64).reshape(-1)
        if slots.size and (slots.min() < 0 or slots.max() >= len(self._refcount)):
            raise ValueError(f"slots must be slot ids in [0, {len(self._refcount)})")
        if slots.size and (self._refcount[slots] <= 0).any():
            free = int(slots[self._refcount[slots] <= 0][0])
            raise ValueError(f"slot {free} is free: only slots in use can be shared")
        if np.unique(slots).size != slots.size:
            raise ValueError("slots must be distinct slot ids (a row never stores a slot twice)")
        self._refcount[slots] += 1
        return RowSnapshot(slots, self)

    def restore(self, snapshots: Sequence[RowSnapshot]) -> None:
        """Make the rows copies of `snapshots` (in order); the current rows are dropped.

        Every snapshot must be a live one made by this cache's `snapshot`. The snapshots stay
        valid (each new row takes its own references). O(Σ lengths) ints.
        """
        snapshots = checks.snapshot_list("snapshots", snapshots, self, RowSnapshot)
        starts = np.array([s.start for s in snapshots], dtype=np.int64)
        lengths = np.array([s.start + s.slots.size for s in snapshots], dtype=np.int64)
        width = max(int(lengths.max(initial=0)), self._table.shape[1])
        table = np.zeros((len(snapshots), width), dtype=np.int64)
        for row, snapshot in enumerate(snapshots):
            table[row, snapshot.start : lengths[row]] = snapshot.slots
            self._refcount[snapshot.slots] += 1
        self.select([])  # release the old rows (the snapshots hold their own references)
        self._table = table
        self._lengths = lengths
        self._starts = starts

    def release(self, snapshot: RowSnapshot) -> None:
        """Give back a snapshot's references (once); its unshared slots become free."""
        checks.snapshot("snapshot", snapshot, self, RowSnapshot)
        slots, snapshot.slots = snapshot.slots, None
        self._refcount[slots] -= 1
        self._push_free(slots[self._refcount[slots] == 0])

    def reset(self, batch_size: int = 1) -> None:
        """Drop every row and start over with `batch_size` (an int >= 0) empty rows."""
        batch_size = checks.bounded("batch_size", batch_size, 0)
        self.select([])
        self._table = np.zeros((batch_size, self._table.shape[1]), dtype=np.int64)
        self._lengths = np.zeros(batch_size, dtype=np.int64)
        self._starts = np.zeros(batch_size, dtype=np.int64)

    def copy_prefix(self, source: KVCache, source_row: int, length: int, row: int = 0) -> None:
        """Fill the empty `row` with the first `length` cached tokens of `source`'s `source_row`
        (keys and values of this cache's layers, copied from `source`'s first layers).

        For a model that shares the source model's first layers (an early-exit draft reusing the
        target's prompt). Both caches must have the same KV heads, head size and KV format
        (`kv_dtype`: elements and int8 scales are copied as stored), and the source at least as
        many layers; the keys keep their positions, so `row` must be empty.
        Copies length·layers slots. TypeError / ValueError name the argument.
        """
        if not isinstance(source, KVCache):
            raise TypeError(f"source must be a KVCache, got {type(source).__name__}")
        row = self._check_row(row)
        source_row = checks.row("source_row", source_row, source.batch_size)
        length = checks.bounded("length", length, 0, source.length(source_row))
        if length and source._starts[source_row]:
            raise ValueError(f"source row {source_row} no longer holds its first {int(source._starts[source_row])} "
                             f"positions (released by the sliding window); copy_prefix needs positions from 0")
        for name in ("num_kv_heads", "head_dim", "kv_dtype"):
            if getattr(source, name) != getattr(self, name):
                raise ValueError(f"source cache has {name}={getattr(source, name)}, this cache {getattr(self, name)}")
        if source.num_layers < self.num_layers:
            raise ValueError(f"source cache has {source.num_layers} layers, fewer than this cache's {self.num_layers}")
        if self._lengths[row]:
            raise ValueError(f"row {row} holds {int(self._lengths[row])} tokens; copy_prefix fills an empty row")
        if length == 0:
            return
        counts = np.zeros(self.batch_size, dtype=np.int64)
        counts[row] = length
        slots, _, _ = self.allocate(counts)
        source_slots = torch.from_numpy(source._table[source_row, :length].copy())
        for layer in range(self.num_layers):
            self.pools[layer].index_copy_(0, slots, source.pools[layer].index_select(0, source_slots))
            if self.scales:
                self.scales[layer].index_copy_(0, slots, source.scales[layer].index_select(0, source_slots))

    @property
    def pool_bytes(self) -> int:
        """Bytes of every layer's pool and scales as allocated (used and free slots)."""
        return sum(t.nbytes for t in self.pools) + sum(t.nbytes for t in self.scales)

    def layer_scales(self, layer: int) -> torch.Tensor | None:
        """`layer`'s int8 scales `(S, 2, KVH)`, None for float pools (the fused kernels' argument)."""
        return self.scales[layer] if self.scales else None

    @property
    def num_cached_slots(self) -> int:
        """Distinct slots in use (shared prefixes counted once)."""
        return int((self._refcount > 0).sum())

    # ------------------------------------------------------- used by the model
    def allocate(self, new_counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reserve slots for `new_counts[b]` new tokens in each row and extend the rows.

        Returns `(write_slots (N,), read_table (B, T_kv), positions (B, T_q))` where N is the
        total of new tokens in row-major order, T_kv the longest row after the append and
        T_q = max(new_counts); positions of padding queries continue past the row's end.
        """
        new_counts = np.asarray(new_counts, dtype=np.int64)
        if new_counts.shape != self._lengths.shape:
            raise ValueError(f"got new tokens for {new_counts.size} rows, the cache has {self.batch_size}")
        start = self._lengths
        end = start + new_counts
        if end.max(initial=0) > self.max_length:
            row = int(end.argmax())
            raise ValueError(
                f"row {row} would hold {int(end[row])} tokens, more than the model's context of "
                f"{self.max_length}{self.context_note}"
            )
        if self.window is not None:
            self._release_outside_window(start)
        total = int(new_counts.sum())
        if total > self._num_free:
            self._grow(max(2 * len(self._refcount), len(self._refcount) + total))
        slots = self._free[self._num_free - total : self._num_free][::-1].copy()
        self._num_free -= total
        self._refcount[slots] = 1
        t_kv = int(end.max(initial=0))
        if t_kv > self._table.shape[1]:
            grown = np.zeros((self.batch_size, max(t_kv, 2 * self._table.shape[1])), dtype=np.int64)
            grown[:, : self._table.shape[1]] = self._table
            self._table = grown
        offset = 0
        for row in range(self.batch_size):
            n = int(new_counts[row])
            self._table[row, start[row] : end[row]] = slots[offset : offset + n]
            offset += n
        self._lengths = end
        t_q = int(new_counts.max(initial=0))
        positions = start[:, None] + np.arange(t_q)[None, :]
        return (
            torch.from_numpy(slots),
            torch.from_numpy(np.ascontiguousarray(self._table[:, :t_kv])),
            torch.from_numpy(positions),
        )

    def write(self, layer: int, slots: torch.Tensor, key_value: torch.Tensor) -> None:
        """Store `key_value: (N, 2, KVH, D)` float32 of new tokens into `slots: (N,)` of `layer`,
        rounded to the cache's format."""
        if self.scales:
            codes, scales = quantize_int8(key_value)
            self.pools[layer].index_copy_(0, slots, codes)
            self.scales[layer].index_copy_(0, slots, scales)
        else:
            self.pools[layer].index_copy_(0, slots, key_value.to(self.dtype))

    def read(self, layer: int, table: torch.Tensor) -> torch.Tensor:
        """Keys and values of `layer` gathered through `table (B, T)`: `(B, T, 2, KVH, D)` float32
        (compact formats widened, int8 dequantized, for the gathered rows only)."""
        batch, length = table.shape
        flat = table.reshape(-1)
        kv = self.pools[layer].index_select(0, flat)
        if self.scales:
            kv = dequantize_int8(kv, self.scales[layer].index_select(0, flat))
        elif self.dtype != torch.float32:
            kv = kv.float()
        return kv.view(batch, length, 2, self.num_kv_heads, self.head_dim)

    # ------------------------------------------------------------ internals
    def _check_row(self, row: int) -> int:
        return checks.row("row", row, self.batch_size)

    def _slots_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Distinct slot ids used by `rows`."""
        if rows.size == 0:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate([self._table[r, self._starts[r] : self._lengths[r]] for r in rows]))

    def _release_outside_window(self, lengths: np.ndarray) -> None:
        """Release, per row, the slots no future query reads: the next token (at position
        `lengths[b]`) sees keys from lengths[b] − W + 1 on, and `keep` more are held for
        truncation. Done in chunks of at least `keep` positions (≥ 1) so the work is rare."""
        target = lengths - self.window + 1 - self.keep
        due = np.nonzero(target - self._starts >= max(self.keep, 1))[0]
        for row in due:
            dropped = self._table[row, self._starts[row] : target[row]]
            self._refcount[dropped] -= 1
            self._push_free(dropped[self._refcount[dropped] == 0])
            self._starts[row] = target[row]

    def _push_free(self, slots: np.ndarray) -> None:
        n = slots.size
        if n:
            self._free[self._num_free : self._num_free + n] = slots
            self._num_free += n

    def _grow(self, capacity: int) -> None:
        old = len(self._refcount)
        if capacity <= old:
            return
        shape = (capacity, 2, self.num_kv_heads, self.head_dim)
        for layer in range(self.num_layers):
            grown = torch.zeros(shape, dtype=self.dtype)
            if old:
                grown[:old] = self.pools[layer]
            if len(self.pools) <= layer:
                self.pools.append(grown)
            else:
                self.pools[layer] = grown
            if self.dtype == torch.int8:
                scales = torch.zeros(shape[:-1], dtype=torch.float32)
                if old:
                    scales[:old] = self.scales[layer]
                if len(self.scales) <= layer:
                    self.scales.append(scales)
                else:
                    self.scales[layer] = scales
        refcount = np.zeros(capacity, dtype=np.int32)
        refcount[:old] = self._refcount
        self._refcount = refcount
        free = np.zeros(capacity, dtype=np.int64)
        free[: self._num_free] = self._free[: self._num_free]
        # new slots go below the existing free ones so low ids are handed out first
        new_slots = np.arange(capacity - 1, old - 1, -1, dtype=np.int64)
        free = np.concatenate([new_slots, free[: self._num_free]])
        self._free = np.zeros(capacity, dtype=np.int64)
        self._free[: free.size] = free
        self._num_free = free.size
