"""Token trees as tries: continuations merged on shared prefixes, and several draft trees fused
into one (RASD's tree fusion, Quan et al. 2025) under a node budget.

A tree is `(tokens, parents)` as in `Draft` (node i is token tokens[i] after node parents[i],
−1 the last committed token, parents pointing backwards). In a trie no two children of one node
carry the same token, so the target scores each distinct prefix once.

    continuation_tree   continuations c_1..c_r -> the trie of their prefixes; each node's count
                        is how many continuations pass through it, and the `max_nodes` most
                        frequent nodes are kept (a node counts at most its parent: a parent
                        always comes first). O(r·ℓ + m log m) for length ℓ, m trie nodes.
    fuse_trees          trees T_1..T_s -> their prefix-merge: level by level, and within a level
                        tree by tree in node order, a node joins the node of the merged tree that
                        its path already reaches or becomes a new node while the budget lasts;
                        a node not kept drops its subtree. O(Σ m_i).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["continuation_tree", "fuse_trees"]

Tree = tuple[list[int], list[int]]  # (tokens, parents)


def continuation_tree(continuations: Sequence[Sequence[int]], max_nodes: int) -> Tree:
    """The trie of `continuations`' prefixes, at most `max_nodes` nodes: the nodes that most
    continuations pass through, ties broken by depth then by first appearance; nodes renumbered
    in that order (parents first)."""
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> trie node
    tokens, parents, counts, depths = [], [], [], []
    for continuation in continuations:
        node = -1
        for token in continuation:
            child = index.get((node, token))
            if child is None:
                child = index[(node, token)] = len(tokens)
                tokens.append(token)
                parents.append(node)
                counts.append(0)
                depths.append(1 if node < 0 else depths[node] + 1)
            counts[child] += 1
            node = child
    kept = sorted(range(len(tokens)), key=lambda i: (-counts[i], depths[i], i))[:max(0, max_nodes)]
    renumber = {-1: -1, **{old: new for new, old in enumerate(kept)}}
    return [tokens[i] for i in kept], [renumber[parents[i]] for i in kept]


def fuse_trees(trees: Sequence[Tree], max_nodes: int) -> Tree:
    """The prefix-merge of `trees` (earlier trees first within each level) with at most
    `max_nodes` nodes, numbered in the order they join (level by level: parents first)."""
    index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    tokens: list[int] = []
    parents: list[int] = []
    merged = [[None] * len(tree_tokens) for tree_tokens, _ in trees]  # tree node -> merged node
    levels = [_levels(tree_parents) for _, tree_parents in trees]
    for level in range(max((len(tree_levels) for tree_levels in levels), default=0)):
        for t, (tree_tokens, tree_parents) in enumerate(trees):
            for i in levels[t][level] if level < len(levels[t]) else ():
                parent = tree_parents[i]
                merged_parent = -1 if parent < 0 else merged[t][parent]
                if merged_parent is None:  # its parent was left out: so is it
                    continue
                node = index.get((merged_parent, tree_tokens[i]))
                if node is None and len(tokens) < max_nodes:
                    node = index[(merged_parent, tree_tokens[i])] = len(tokens)
                    tokens.append(tree_tokens[i])
                    parents.append(merged_parent)
                merged[t][i] = node
    return tokens, parents


def _levels(parents: Sequence[int]) -> list[list[int]]:
    """Node indices per depth (level 0: the children of −1), in node order. O(m)."""
    depths: list[int] = []
    levels: list[list[int]] = []
    for i, parent in enumerate(parents):
        depth = 0 if parent < 0 else depths[parent] + 1
        depths.append(depth)
        if depth == len(levels):
            levels.append([])
        levels[depth].append(i)
    return levels
