"""Model-free token trees: the continuations prompt lookup and the n-gram table find, as
branches (the tree form of `ngram.NgramDrafter`).

At a node whose path is s (the row's committed tokens, then the node's root-to-node draft
tokens), the candidate next tokens are, in this order, without repeats:

    for k = max_ngram down to min_ngram (the last k tokens of s as the suffix):
        the tokens that followed the suffix's earlier occurrences in the row, latest first
            (at most `scan` occurrences per suffix)
        the token that last followed it in the drafter's past outputs (the n-gram table)

and the node's children are the first k_d of them (`widths = (k_1, k_2, ...)`, k_d at depth
d), filled breadth first within `max_nodes` and cut to the row's draft length γ_b. The first
child is the token the chain lookup would take next, so a tree holds the chain's first step and
its alternatives as siblings. Siblings are distinct tokens and every node is a point mass
(`probs` None), which the multi-draft rule verifies losslessly: each child is accepted with
the residual probability r(x), then r loses x (`tree_verify`).

Cost per row and step: O(nodes · (max_ngram − min_ngram + 1) · scan) dictionary lookups; no
model forward.
"""

from __future__ import annotations

from collections.abc import Sequence

from metagen.decoding.drafts import Draft
from metagen.speculative.ngram import NgramDrafter, _NgramIndex
from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES, DEFAULT_WIDTHS, check_tree_shape

__all__ = ["NgramTreeDrafter"]

SCAN = 32  # earlier occurrences of one suffix read for candidates


class NgramTreeDrafter(NgramDrafter):
    """Prompt lookup and n-gram table continuations as a static tree of point masses.

    widths: children per node at each depth (ints >= 1); max_nodes: node budget per row;
    scan: earlier occurrences of a suffix read (>= 1). Other arguments as `NgramDrafter`.
    """

    proposes_trees = True

    def __init__(self, widths: Sequence[int] = DEFAULT_WIDTHS, max_nodes: int = DEFAULT_MAX_NODES, *,
                 max_ngram: int = 3, min_ngram: int = 1, remember_outputs: bool = True,
                 memory_size: int = 200_000, scan: int = SCAN) -> None:
        self.widths = check_tree_shape(widths, max_nodes)
        if isinstance(scan, bool) or not isinstance(scan, int) or scan < 1:
            raise ValueError(f"scan={scan!r} must be an int >= 1")
        super().__init__(max_ngram, min_ngram, remember_outputs, memory_size)
        self.max_nodes, self.scan = max_nodes, scan

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        tokens, parents = [], []
        for b, context in enumerate(contexts):
            index = self._rows[b]
            index.extend(context[len(index.tokens):])
            row_tokens, row_parents = self._tree(index, lengths[b])
            tokens.append(row_tokens)
            parents.append(row_parents)
        return Draft(tokens, parents, [None] * len(contexts))

    def _tree(self, index: _NgramIndex, depth: int) -> tuple[list[int], list[int]]:
        """(tokens, parents) of one row's tree, at most `depth` deep, breadth first."""
        tokens: list[int] = []
        parents: list[int] = []
        frontier: list[tuple[int, list[int]]] = [(-1, [])]  # (node, its root-to-node tokens)
        for width in self.widths[:depth]:
            grown = []
            for node, path in frontier:
                room = min(width, self.max_nodes - len(tokens))
                for token in self._continuations(index, path, room):
                    parents.append(node)
                    tokens.append(token)
                    grown.append((len(tokens) - 1, path + [token]))
            frontier = grown
            if not frontier:
                break
        return tokens, parents

    def _continuations(self, index: _NgramIndex, path: list[int], count: int) -> list[int]:
        """Up to `count` distinct candidates after the committed tokens + `path` (module docstring)."""
        found: list[int] = []
        if count <= 0:
            return found
        tail = (index.tokens[-self.max_ngram:] + path)[-self.max_ngram:]
        for k in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            suffix = tuple(tail[-k:])
            candidates = [index.tokens[position] for position in index.followers(suffix, self.scan)]
            if suffix in self.memory:
                candidates.append(self.memory[suffix])
            for token in candidates:
                if token not in found:
                    found.append(token)
                    if len(found) == count:
                        return found
        return found
