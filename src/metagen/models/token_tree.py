"""Token trees fed in one forward: the masks and positions of tree verification (SpecInfer,
Miao et al. 2024).

A row's fed tokens may form a tree, given as `parents (m,)`: parents[i] is the index among the
row's fed tokens of token i's parent, or −1 for a child of the row's last cached token, and
parents[i] < i (a parent is fed before its children). With L the row's cached length:

    position(i) = L + depth(i)          (depth 0 for a root)
    token i attends to: every cached key of its row, its ancestors among the fed tokens, itself

so each node's logits are those of feeding its root-to-node chain alone. The fed tokens still
take the row's next m page-table entries in fed order (entry L + i holds token i's keys and
values, rotated for position L + depth(i)); `KVCache.keep_path` then keeps one root-to-node path.
A chain (parents[i] = i − 1, or a row's tree None) is an ordinary append.

The two paths of `layer_ops` read the tree through a `TreeLayout`: the general path as a mask
over page-table columns, the fused path as one page table per query (the cached entries, then
its ancestors' entries at columns L + depth, then its own), so the fused attention kernel reads
a tree node exactly as it reads the last token of a chain, unchanged. Building either is O(Σ m²)
integers per forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from metagen.models import checks


def check_trees(tree: object, counts: np.ndarray) -> list[np.ndarray | None] | None:
    """`tree` (None, or one entry per row: None or the row's parents) checked against the fed
    tokens per row `counts (B,)`: per row None (a chain) or its parents `(m,)` int64. Rows whose
    parents form a chain become None, so they take the ordinary path; None when no row is a tree.
    TypeError / ValueError name `tree[b]` or `tree[b][i]`, the value and the allowed range."""
    if tree is None:
        return None
    if isinstance(tree, (str, bytes, torch.Tensor, np.ndarray)) or not isinstance(tree, Sequence):
        raise TypeError(f"tree must be a list with one entry per row (None or that row's parents), "
                        f"got {type(tree).__name__}")
    if len(tree) != len(counts):
        raise ValueError(f"tree has {len(tree)} entries but tokens has {len(counts)} rows: give one per row")
    trees: list[np.ndarray | None] = []
    for b, parents in enumerate(tree):
        if parents is None:
            trees.append(None)
            continue
        if isinstance(parents, (str, bytes)) or not isinstance(parents, (Sequence, np.ndarray, torch.Tensor)):
            raise TypeError(f"tree[{b}] must be a sequence of parent indices, got {type(parents).__name__}")
        values = [checks.integer(f"tree[{b}][{i}]", p) for i, p in enumerate(parents)]
        if len(values) != counts[b]:
            raise ValueError(f"tree[{b}] has {len(values)} parents but row {b} feeds {int(counts[b])} tokens: "
                             f"give one parent per fed token")
        for i, parent in enumerate(values):
            if not -1 <= parent < i:
                raise ValueError(f"tree[{b}][{i}]={parent} is out of range: a parent index must be in [-1, {i - 1}] "
                                 f"(an earlier fed token of the row, or -1 for a child of the cached tokens)")
        array = np.array(values, dtype=np.int64)
        is_chain = bool((array == np.arange(-1, len(values) - 1)).all())
        trees.append(None if is_chain else array)
    return trees if any(parents is not None for parents in trees) else None


def ancestors(parents: np.ndarray) -> np.ndarray:
    """`(m, m)` bool: [i, j] when fed token j is token i or one of its ancestors. O(m²)."""
    m = parents.size
    mask = np.zeros((m, m), dtype=bool)
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


class TreeLayout:
    """The trees of one forward, for the layer ops. `trees` from `check_trees` (at least one
    tree); `positions (B, T_q)` int64 from `KVCache.allocate` (row b's fed token i at L_b + i,
    padding queries past the row's count continuing so).

    positions: the same with each tree row's real queries at L_b + depth(i);
    rows: [(b, L_b, ancestors (m, m), depths (m,))] of the tree rows."""

    def __init__(self, trees: list[np.ndarray | None], positions: torch.Tensor) -> None:
        self.rows = []
        self.positions = positions.clone()
        for b, parents in enumerate(trees):
            if parents is None:
                continue
            mask = ancestors(parents)
            depths = mask.sum(axis=1) - 1  # ancestors above i
            cached = int(positions[b, 0])
            self.positions[b, : parents.size] = torch.from_numpy(cached + depths)
            self.rows.append((b, cached, mask, depths))

    def column_mask(self, t_kv: int) -> torch.Tensor:
        """`(B, 1, T_q, T_kv)` bool over page-table columns: causal by column (query i of row b
        sees columns ≤ L_b + i, which keeps padding queries' rows non-empty), with each tree
        row's fed block [L_b, L_b + m) replaced by its ancestor mask."""
        t_q = self.positions.shape[1]
        columns = np.arange(t_kv)
        ends = self.positions[:, :1].numpy() + np.arange(t_q)[None, :]  # (B, T_q): L_b + i (a root at L_b)
        mask = columns[None, None, :] <= ends[:, :, None]
        for b, cached, ancestor, _ in self.rows:
            m = ancestor.shape[0]
            mask[b, :m, cached : cached + m] = ancestor
        return torch.from_numpy(mask).unsqueeze(1)

    def key_positions(self, t_kv: int) -> torch.Tensor:
        """`(B, T_kv)` int64: the position of each page-table column's key (its column, but
        L_b + depth(j) for a tree row's fed token j), for sliding-window masks."""
        keys = np.broadcast_to(np.arange(t_kv), (self.positions.shape[0], t_kv)).copy()
        for b, cached, _, depths in self.rows:
            keys[b, cached : cached + depths.size] = cached + depths
        return torch.from_numpy(keys)

    def query_tables(self, table: torch.Tensor, query_table: torch.Tensor, counts: np.ndarray) -> None:
        """Give each tree query its own page table, in place in `query_table (N, T_kv)` (the
        packed queries' copies of their rows of `table (B, T_kv)`): columns [L_b, L_b + depth(i)]
        become the entries of token i's ancestors, root first, and itself."""
        first_query = np.concatenate(([0], np.cumsum(counts)))
        source = table.numpy()
        target = query_table.numpy()  # shares memory with query_table
        for b, cached, ancestor, depths in self.rows:
            queries, fed = np.nonzero(ancestor)  # pairs (i, j): j is i or an ancestor of i
            target[first_query[b] + queries, cached + depths[fed]] = source[b, cached + fed]
