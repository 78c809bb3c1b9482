"""A static token tree from a draft model (SpecInfer-style, Miao et al. 2024): each node at depth
d gets k_d children, `widths = (k_1, k_2, ...)`, within a node budget. Every model drafter of
the registry (early-exit, quantized, model:PATH) builds one over its draft model when given tree
options; `ngram_tree` is the model-free counterpart.

Per step and row (the draft cache following the committed tokens as in `ModelDrafter`):

    p(root)          = chain(draft logits after the context)
    level d = 1, 2…  for every frontier node n (breadth first, within `max_nodes`):
                       children of n = k_d tokens drawn from p(n) without replacement,
                                       in draw order (the top k_d at temperature 0);
                                       with `replacement=True`, k_d i.i.d. draws (SpecTr)
    p(n)             read for every new frontier node from one tree forward of the draft over
                     the tree so far (ancestor-only attention, `models/token_tree.py`), the
                     chain's state advanced by n's path (a fork); the rows are then truncated
                     back to their contexts

Each child's `probs` row is its parent's p(n) — the one distribution its siblings were drawn
from — which is what recursive rejection sampling (`tree_verify`) and SpecTr's k-sequential
selection (`spectr`, i.i.d. siblings, `Draft.iid_siblings`) need to stay lossless; greedy
trees carry no distributions (point masses). Cost per step: one catch-up forward plus one tree
forward per level after the first, each over the whole tree so far (O(depth·nodes) draft tokens).

The loop (`TreeDrafter.propose`: evaluate pending nodes, grow, repeat) is shared with the
dynamic tree of `dyspec`, which only changes where the tree grows (`_grow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from metagen.decoding.cost import forward_flops
from metagen.decoding.drafts import Draft
from metagen.speculative.drafters import ModelDrafter

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_WIDTHS", "TreeBuild", "TreeDrafter", "check_tree_shape"]

DEFAULT_WIDTHS = (2, 2, 1)  # children per node at depths 1, 2, 3: up to 2 + 4 + 4 = 10 nodes
DEFAULT_MAX_NODES = 16


@dataclass
class TreeBuild:
    """One row's tree while it is drafted: nodes in the order they were added.

    limit: the deepest a node may sit (the row's γ_b); depths[i]: node i's depth (1 below the
    root); probs[i]: (V,) the distribution node i was drawn from (its parent's, after the chain;
    absent at temperature 0); evaluated: node (−1 the root) -> (V,) the draft's logits after
    its path, after the chain, for the nodes evaluated and not yet expanded.
    """

    limit: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    probs: list[Tensor] = field(default_factory=list)
    evaluated: dict[int, Tensor] = field(default_factory=dict)

    def depth(self, node: int) -> int:
        """0 for the root (−1)."""
        return 0 if node < 0 else self.depths[node]

    def add(self, parent: int, token: int, distribution: Tensor | None) -> int:
        """Append `token` under `parent`, drawn from `distribution` (None: a point mass); its index."""
        self.parents.append(parent)
        self.tokens.append(token)
        self.depths.append(self.depth(parent) + 1)
        if distribution is not None:
            self.probs.append(distribution)
        return len(self.tokens) - 1


class TreeDrafter(ModelDrafter):
    """Static top-k trees (sampled without replacement at temperature > 0) from a draft model.

    widths: children per node at each depth (ints >= 1); the tree's depth is len(widths), cut
        to the row's draft length γ_b. max_nodes: node budget per row, filled breadth first.
    replacement: draw a node's children i.i.d. with replacement (SpecTr's k drafts, for the
        `spectr` rule: a token may repeat, each copy expanded on its own) instead of without
        replacement (distinct children, for recursive rejection sampling); greedy trees take
        the top k_d either way.
    Other arguments as `ModelDrafter` (no `confidence`: the tree's shape is fixed).

    `propose` is the one tree-drafting loop: evaluate the pending nodes (one draft tree forward,
    the chain forked along each node's path), let `_grow` add children to evaluated nodes and
    name the new nodes it wants evaluated, repeat until it names none. A subclass changes the
    tree's shape by overriding `_grow` (and `_new_build` for its own per-row state): `DySpecDrafter`.
    """

    proposes_trees = True

    def __init__(self, model, *, widths: Sequence[int] = DEFAULT_WIDTHS, max_nodes: int = DEFAULT_MAX_NODES,
                 replacement: bool = False, name: str = "tree", share_prompt_cache: bool = False) -> None:
        widths = check_tree_shape(widths, max_nodes)
        super().__init__(model, name=name, share_prompt_cache=share_prompt_cache)
        self.widths, self.max_nodes, self.iid_siblings = widths, max_nodes, bool(replacement)

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        batch = len(contexts)
        if self.cache is None or self.cache.batch_size != batch:
            rows = 0 if self.cache is None else self.cache.batch_size
            raise RuntimeError(f"{self.name} drafter has {rows} rows, got {batch}: call start()/select() first")
        if max(lengths, default=0) == 0:
            return Draft.chain([[] for _ in range(batch)])
        out, flops = self._catch_up(contexts)
        calls = 1
        builds = [self._new_build(limit) for limit in lengths]
        pending = [(b, -1) for b in range(batch) if lengths[b] > 0]  # (row, node) to evaluate
        logits = out.logits[[b for b, _ in pending]]  # (P, V)
        while True:
            processed = self._process(chain, builds, pending, logits)  # (P, V)
            for (b, node), row_logits in zip(pending, processed):
                builds[b].evaluated[node] = row_logits
            pending = [(b, node) for b, build in enumerate(builds) if build.limit > 0
                       for node in self._grow(build, chain.greedy, generator)]
            if not pending:
                break
            logits, spent = self._tree_logits(contexts, builds, pending)
            calls, flops = calls + 1, flops + spent
        probs = [torch.stack(build.probs) if build.probs and not chain.greedy else None for build in builds]
        return Draft([build.tokens for build in builds], [build.parents for build in builds], probs, calls, flops,
                     iid_siblings=self.iid_siblings)

    def _new_build(self, limit: int) -> TreeBuild:
        """A row's empty tree, nodes at most `limit` deep."""
        return TreeBuild(limit)

    def _grow(self, build: TreeBuild, greedy: bool, generator) -> list[int]:
        """Static shape: every evaluated node at depth d gets k_{d+1} children (within the node
        budget, in node order: breadth first); returns the new nodes to evaluate (those that
        will have children)."""
        deepest = min(len(self.widths), build.limit)
        grown = []
        for node in sorted(build.evaluated):
            processed = build.evaluated.pop(node)
            room = self.max_nodes - len(build.tokens)
            width = min(self.widths[build.depth(node)], room)
            chosen, distribution = _children(processed, width, greedy, generator, self.iid_siblings)
            for token in chosen:
                child = build.add(node, token, distribution)
                if build.depths[child] < deepest:
                    grown.append(child)
        return grown

    def _tree_logits(self, contexts, builds: list[TreeBuild], pending) -> tuple[Tensor, float]:
        """The draft's logits after each pending node `(P, V)`: one tree forward of every row's
        nodes so far after its cached context, then every row truncated back to its context."""
        feed = [list(build.tokens) if build.tokens else [context[-1]] for build, context in zip(builds, contexts)]
        tree = [list(build.parents) if build.tokens else None for build in builds]
        out = self.model.forward(self.cache, feed, logits="all", tree=tree)  # (B, most nodes, V)
        flops = 0.0
        for b, context in enumerate(contexts):
            flops += forward_flops(self.model, len(context), len(feed[b]))
            self.cache.truncate(b, len(context))
        rows = torch.tensor([b for b, _ in pending])
        nodes = torch.tensor([node for _, node in pending])
        return out.logits[rows, nodes], flops

    @staticmethod
    def _process(chain, builds: list[TreeBuild], pending, logits: Tensor) -> Tensor:
        """`logits (P, V)` after the chain, row i's state advanced by pending node i's path: one
        fork per depth among the pending nodes (the chain itself is never advanced)."""
        processed = torch.empty_like(logits)
        paths = [_path(builds[b].tokens, builds[b].parents, node) for b, node in pending]
        for depth in sorted({len(path) for path in paths}):
            group = [i for i, path in enumerate(paths) if len(path) == depth]
            fork = chain.fork(torch.tensor([pending[i][0] for i in group]))
            for t in range(depth):
                fork.accept(torch.tensor([paths[i][t] for i in group]))
            processed[group] = fork.process(logits[group])
        return processed


def check_tree_shape(widths: Sequence[int], max_nodes: int) -> tuple[int, ...]:
    """`widths` as a tuple; ValueError naming the value unless it is a non-empty sequence of
    ints >= 1 and `max_nodes` an int >= 1."""
    widths = tuple(widths)
    if not widths or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in widths):
        raise ValueError(f"widths={widths!r} must be a non-empty sequence of ints >= 1 (children per node "
                         "at each depth)")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes={max_nodes!r} must be an int >= 1")
    return widths


def _children(processed: Tensor, count: int, greedy: bool, generator,
              replacement: bool = False) -> tuple[list[int], Tensor | None]:
    """Up to `count` tokens from `processed (V,)`: the top ones when greedy, else `count` i.i.d.
    draws from p = softmax(processed) (`replacement`), or distinct tokens drawn one after another
    without replacement (p, returned, is what each was drawn from before the earlier ones were
    removed). Never a token the chain removed."""
    allowed = int(torch.isfinite(processed).sum())
    if not replacement or greedy:
        count = min(count, allowed)
    if count <= 0 or allowed == 0:
        return [], None
    if greedy:
        return processed.topk(count).indices.tolist(), None
    distribution = torch.softmax(processed, dim=-1)  # (V,)
    if replacement:
        return torch.multinomial(distribution, count, replacement=True, generator=generator).tolist(), distribution
    weights, chosen = distribution.clone(), []
    for _ in range(count):
        if float(weights.sum()) <= 0:
            break
        token = int(torch.multinomial(weights, 1, generator=generator))
        chosen.append(token)
        weights[token] = 0.0
    return chosen, distribution


def _path(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """Tokens from the root to `node` inclusive (empty for −1)."""
    path = []
    while node != -1:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]
