"""Token recycling (Luo et al. 2024, "Turning Trash into Treasure"): a model-free tree drafter
whose only state is an adjacency matrix of each token's likely successors, refreshed from the
logits the target computes anyway.

    A                       (V, k) int32, A[v] = the target's top-k next tokens the last time
                            it scored a position whose last token was v (-1: never seen)
    observe(fed, logits, _) for every position j of the verify forward — rejected draft nodes
                            included (the "trash") — A[fed[b][j]] ← topk(logits[b, j], k)
    propose                 per row, a breadth-first tree from A starting at the last committed
                            token t0: the children of a node with token v at depth d are
                            A[v, :widths[d-1]] (best first), nodes added level by level until
                            `max_nodes`; depth at most min(len(widths), γ_b)

The tree's shape is static (widths per depth and a node budget), as in the paper; only its
tokens change. The drafts are point masses (no distribution), which the multi-draft rule
verifies losslessly: each child is accepted with probability r(x), greedy tree verification at
temperature 0. The matrix is kept across requests (the paper's hot start). Memory: V·k·4 bytes
(V = 150k, k = 8: 4.8 MB); update O(N·V) for the top-k over N positions, one (N, k) scatter;
a tree O(max_nodes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.drafts import Draft, Drafter
from metagen.speculative.tree_drafter import check_tree_shape

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_WIDTHS", "RecyclingDrafter", "bfs_tree"]

DEFAULT_WIDTHS = (4, 2, 1, 1, 1, 1)  # 4 + 8 + 8 + 8 nodes to depth 4 (the default γ), then 4 more
DEFAULT_MAX_NODES = 32


class RecyclingDrafter(Drafter):
    """Trees from the successor matrix `successors (V, k)` (module docstring).

    vocab_size: V. candidates: k, successors kept per token (>= max(widths)). widths: children
    per node at each depth (ints >= 1). max_nodes: node budget per row and step (>= 1).
    """

    name = "recycling"
    proposes_trees = True

    def __init__(self, vocab_size: int, *, widths: Sequence[int] = DEFAULT_WIDTHS,
                 max_nodes: int = DEFAULT_MAX_NODES, candidates: int | None = None) -> None:
        widths = check_tree_shape(widths, max_nodes)
        candidates = max(widths) if candidates is None else candidates
        for label, value, low in (("vocab_size", vocab_size, 1), ("candidates", candidates, max(widths))):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{label}={value!r} must be an int >= {low}")
        if candidates > vocab_size:
            raise ValueError(f"candidates={candidates} exceeds vocab_size={vocab_size}")
        self.vocab_size, self.widths, self.max_nodes = vocab_size, widths, max_nodes
        self.successors = torch.full((vocab_size, candidates), -1, dtype=torch.int32)  # (V, k)

    def observe(self, fed: Sequence[Sequence[int]], logits: Tensor, committed=None) -> None:
        """A[v] ← top-k of the logits after each fed token v; a token fed twice keeps its later
        position's (the deeper one: more context)."""
        latest: dict[int, tuple[int, int]] = {}  # token -> (row, position)
        for b, tokens in enumerate(fed):
            for j, token in enumerate(tokens):
                latest[token] = (b, j)
        if not latest:
            return
        rows = torch.tensor([b for b, _ in latest.values()])
        positions = torch.tensor([j for _, j in latest.values()])
        top = logits[rows, positions].topk(self.successors.shape[1], dim=-1).indices  # (N, k)
        self.successors[torch.tensor(list(latest))] = top.to(torch.int32)

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        tokens, parents = [], []
        for context, length in zip(contexts, lengths):
            row_tokens, row_parents = bfs_tree(self.successors, context[-1], self.widths[:length], self.max_nodes)
            tokens.append(row_tokens)
            parents.append(row_parents)
        return Draft(tokens, parents, [None] * len(tokens))


def bfs_tree(successors: Tensor, root: int, widths: Sequence[int], max_nodes: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree below `root` read from `successors (V, k)`: level d holds,
    for every node of level d − 1 in order, its token's first `widths[d-1]` successors (the
    entries < 0 — none recorded — skipped), until `max_nodes` nodes. Parent −1 is the root.
    O(max_nodes) after one (V, k) → list conversion of the rows read."""
    tokens: list[int] = []
    parents: list[int] = []
    frontier = [(-1, root)]  # (node, token)
    for width in widths:
        grown = []
        for node, token in frontier:
            for child in successors[token, :width].tolist():
                if len(tokens) == max_nodes:
                    return tokens, parents
                if child < 0:
                    continue
                parents.append(node)
                tokens.append(child)
                grown.append((len(tokens) - 1, child))
        frontier = grown
        if not frontier:
            break
    return tokens, parents
