"""A static token tree from a draft model (SpecInfer-style, Miao et al. 2024): each node at depth
d gets k_d children, `widths = (k_1, k_2, ...)`, within a node budget. Every model drafter of
the registry (early-exit, quantized, model:PATH) builds one over its draft model when given tree
options; `ngram_tree` is the model-free counterpart.

Per step and row (the draft cache following the committed tokens as in `ModelDrafter`):

    p(root)          = chain(draft logits after the context)
    level d = 1, 2…  for every frontier node n (breadth first, within `max_nodes`):
                       children of n = k_d tokens drawn from p(n) without replacement,
                                       in draw order (the top k_d at temperature 0)
    p(n)             read for every new frontier node from one tree forward of the draft over
                     the tree so far (ancestor-only attention, `models/token_tree.py`), the
                     chain's state advanced by n's path (a fork); the rows are then truncated
                     back to their contexts

Each child's `probs` row is its parent's p(n) — the one distribution its siblings were drawn
from — which is what recursive rejection sampling (`tree_verify`) needs to stay lossless;
greedy trees carry no distributions (point masses). Cost per step: one catch-up forward plus
one tree forward per level after the first, each over the whole tree so far (O(depth·nodes)
draft tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.decoding.cost import forward_flops
from metagen.decoding.drafts import Draft
from metagen.speculative.drafters import ModelDrafter

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_WIDTHS", "TreeDrafter", "check_tree_shape"]

DEFAULT_WIDTHS = (2, 2, 1)  # children per node at depths 1, 2, 3: up to 2 + 4 + 4 = 10 nodes
DEFAULT_MAX_NODES = 16


class TreeDrafter(ModelDrafter):
    """Static top-k trees (sampled without replacement at temperature > 0) from a draft model.

    widths: children per node at each depth (ints >= 1); the tree's depth is len(widths), cut
        to the row's draft length γ_b. max_nodes: node budget per row, filled breadth first.
    Other arguments as `ModelDrafter` (no `confidence`: the tree's shape is fixed).
    """

    proposes_trees = True

    def __init__(self, model, *, widths: Sequence[int] = DEFAULT_WIDTHS, max_nodes: int = DEFAULT_MAX_NODES,
                 name: str = "tree", share_prompt_cache: bool = False) -> None:
        widths = check_tree_shape(widths, max_nodes)
        super().__init__(model, name=name, share_prompt_cache=share_prompt_cache)
        self.widths, self.max_nodes = widths, max_nodes

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        batch = len(contexts)
        if self.cache is None or self.cache.batch_size != batch:
            rows = 0 if self.cache is None else self.cache.batch_size
            raise RuntimeError(f"{self.name} drafter has {rows} rows, got {batch}: call start()/select() first")
        if max(lengths, default=0) == 0:
            return Draft.chain([[] for _ in range(batch)])
        out, flops = self._catch_up(contexts)
        calls = 1
        tokens: list[list[int]] = [[] for _ in range(batch)]
        parents: list[list[int]] = [[] for _ in range(batch)]
        probs: list[list[Tensor]] = [[] for _ in range(batch)]
        frontier = [(b, -1) for b in range(batch) if lengths[b] > 0]  # (row, node) to expand
        for level, width in enumerate(self.widths):
            if level == 0:
                logits = out.logits[[b for b, _ in frontier]]  # (P, V)
            else:
                logits, spent = self._tree_logits(contexts, tokens, parents, frontier)
                calls, flops = calls + 1, flops + spent
            processed = self._process(chain, tokens, parents, frontier, logits)  # (P, V)
            grown = []
            for (b, node), row_logits in zip(frontier, processed):
                room = self.max_nodes - len(tokens[b])
                chosen, distribution = _children(row_logits, min(width, room), chain.greedy, generator)
                for token in chosen:
                    parents[b].append(node)
                    tokens[b].append(token)
                    if distribution is not None:
                        probs[b].append(distribution)
                    if level + 1 < min(len(self.widths), lengths[b]):
                        grown.append((b, len(tokens[b]) - 1))
            frontier = grown
            if not frontier:
                break
        stacked = [torch.stack(rows) if rows and not chain.greedy else None for rows in probs]
        return Draft(tokens, parents, stacked, calls, flops)

    def _tree_logits(self, contexts, tokens, parents, frontier) -> tuple[Tensor, float]:
        """The draft's logits after each frontier node `(P, V)`: one tree forward of every row's
        nodes so far after its cached context, then every row truncated back to its context."""
        feed = [list(row) if row else [context[-1]] for row, context in zip(tokens, contexts)]
        tree = [list(row) if row else None for row in parents]
        out = self.model.forward(self.cache, feed, logits="all", tree=tree)  # (B, most nodes, V)
        flops = 0.0
        for b, context in enumerate(contexts):
            flops += forward_flops(self.model, len(context), len(feed[b]))
            self.cache.truncate(b, len(context))
        rows = torch.tensor([b for b, _ in frontier])
        nodes = torch.tensor([node for _, node in frontier])
        return out.logits[rows, nodes], flops

    @staticmethod
    def _process(chain, tokens, parents, frontier, logits: Tensor) -> Tensor:
        """`logits (P, V)` after the chain, row i's state advanced by frontier node i's path."""
        paths = [_path(tokens[b], parents[b], node) for b, node in frontier]
        fork = chain.fork(torch.tensor([b for b, _ in frontier]))
        for t in range(len(paths[0])):  # every frontier node sits at one depth
            fork.accept(torch.tensor([path[t] for path in paths]))
        return fork.process(logits)


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


def _children(processed: Tensor, count: int, greedy: bool, generator) -> tuple[list[int], Tensor | None]:
    """Up to `count` distinct tokens from `processed (V,)`: the top ones when greedy, else drawn
    one after another without replacement from p = softmax(processed) (p, returned, is what each
    was drawn from before the earlier ones were removed). Never a token the chain removed."""
    allowed = int(torch.isfinite(processed).sum())
    count = min(count, allowed)
    if count <= 0:
        return [], None
    if greedy:
        return processed.topk(count).indices.tolist(), None
    distribution = torch.softmax(processed, dim=-1)  # (V,)
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
