"""A dynamic token tree (DySpec, Xiong et al. 2024, "DySpec: Faster Speculative Decoding with
Dynamic Token Tree Structure"): the tree grows, node by node within a budget, where the draft
expects the target to accept most, so its shape follows the draft's confidence — deep where
the draft is sure, wide where it hesitates.

Every node n carries an estimate of the chance the target accepts its path, the product of the
draft probabilities along it, v(n) = v(parent)·p(parent)(token), v(root) = 1. A max-heap holds
the nodes that may still get a child, keyed by the value of that next child before it is drawn:

    key(n) = v(n)·(1 − Σ_{children c of n} p(n)(c))      (v(n) before n's first child)
    repeat until max_nodes nodes:
        n = pop the largest key
        x ~ p(n) with n's children removed       (the most probable remaining at temperature 0)
        add child c = (n, x), v(c) = v(n)·p(n)(x);  push c (if shallower than γ_b);  push n back

p(n) — the draft's distribution after n's path, after the sampler chain forked along it — is
read from a draft tree forward; a node popped before it has one ends the round: one tree
forward over the tree so far (`TreeDrafter.propose`, the loop shared with the static tree)
evaluates every node waiting in the heap, and the expansion resumes in the same order, so the
tree is the one a forward per node would give. Forwards per step: 1 (catch-up) plus the rounds,
at most max_nodes.

Lossless under the `multi-draft` rule: a node's children are drawn one after another without
replacement from p(n), each child's `probs` row is p(n), and whether n gets another child is
decided from keys that never depend on the token about to be drawn (only on earlier draws and
other nodes) — the number of siblings is a stopping time of their draws, which recursive
rejection sampling (`tree_verify`) allows.
Cost per pop: O(log m + V) (m nodes); per round one draft forward over the tree so far.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
from torch import Tensor

from metagen.speculative.drafters import ModelDrafter
from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES, TreeBuild, TreeDrafter

__all__ = ["DySpecDrafter"]


@dataclass
class _HeapBuild(TreeBuild):
    """A row's dynamic tree: `heap` of (−key, push order, node), v(n) in `values`, and per
    expanded node its distribution p(n) (float32, as `Draft.probs` keeps it) and what is left of
    it after its children were drawn (float64)."""

    heap: list[tuple[float, int, int]] = field(default_factory=lambda: [(-1.0, 0, -1)])
    values: dict[int, float] = field(default_factory=lambda: {-1: 1.0})
    distributions: dict[int, Tensor] = field(default_factory=dict)
    remaining: dict[int, Tensor] = field(default_factory=dict)
    pushes: int = 1

    def push(self, node: int, key: float) -> None:
        heapq.heappush(self.heap, (-key, self.pushes, node))
        self.pushes += 1


class DySpecDrafter(TreeDrafter):
    """Dynamic trees from a draft model, grown greedily by estimated acceptance (module
    docstring); verified by the `multi-draft` rule.

    max_nodes: node budget per row and step (>= 1); depth is bounded by the row's γ_b.
    Other arguments as `ModelDrafter`.
    """

    def __init__(self, model, *, max_nodes: int = DEFAULT_MAX_NODES, name: str = "dyspec",
                 share_prompt_cache: bool = False) -> None:
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"max_nodes={max_nodes!r} must be an int >= 1")
        ModelDrafter.__init__(self, model, name=name, share_prompt_cache=share_prompt_cache)
        self.widths, self.max_nodes, self.iid_siblings = (), max_nodes, False

    def _new_build(self, limit: int) -> _HeapBuild:
        return _HeapBuild(limit)

    def _grow(self, build: _HeapBuild, greedy: bool, generator) -> list[int]:
        """Pop and expand until the budget is spent or the heap is empty (returns []), or until
        the top node has no distribution yet (returns the heap's unevaluated nodes)."""
        while len(build.tokens) < self.max_nodes and build.heap:
            node = build.heap[0][2]
            if node not in build.remaining:
                if node not in build.evaluated:  # one more draft forward first
                    return [n for _, _, n in build.heap if n not in build.evaluated and n not in build.remaining]
                distribution = torch.softmax(build.evaluated.pop(node).float(), dim=-1)  # (V,) p(n)
                build.distributions[node], build.remaining[node] = distribution, distribution.double()
            heapq.heappop(build.heap)
            weights = build.remaining[node]  # (V,) p(n) without n's children
            if float(weights.sum()) <= 0.0:  # every token the chain allows is a child already
                continue
            if greedy:
                token = int(weights.argmax())
            else:
                token = int(torch.multinomial(weights, 1, generator=generator))
            distribution = build.distributions[node]
            child = build.add(node, token, None if greedy else distribution)
            build.values[child] = build.values[node] * float(distribution[token])
            weights[token] = 0.0
            if build.depths[child] < build.limit:
                build.push(child, build.values[child])
            left = build.values[node] * float(weights.sum())
            if left > 0.0:
                build.push(node, left)
        return []
