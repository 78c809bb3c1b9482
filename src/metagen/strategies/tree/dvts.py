"""Diverse verifier tree search (DVTS; Beeching et al. 2024, search-and-learn).

The budget is split into `subtrees` independent searches. Each starts from its own first step
and, at every depth, samples `expansions` next steps of its single current node and keeps the
one the value rates best (a greedy beam of width 1). Independent subtrees keep the solutions
diverse where one wide beam collapses onto a few high-value prefixes. All subtrees advance in
one batched expand per depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.strategies import runners
from metagen.strategies.options import option
from metagen.strategies.spec import register
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.leaves import TreeConfig, finish_search

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class DVTSConfig(TreeConfig):
    """The subtrees, their branching and the depth limit (TreeConfig: the rest)."""

    subtrees: int = option(4, int, "independent searches", low=1, sizes_work=True)
    expansions: int = option(4, int, "next steps sampled per subtree and depth", low=1, sizes_work=True)
    max_steps: int = option(16, int, "depth limit in steps", low=1, sizes_work=True)


def dvts(model, prompt: Prompt, value, config: DVTSConfig | None = None, *,
         chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    config = config or DVTSConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    first = expander.expand([expander.root], [config.subtrees])[0]
    leaves = [node for node in first if node.finished]
    frontier = [node for node in first if not node.finished]  # one current node per subtree
    for _ in range(config.max_steps - 1):
        if not frontier:
            break
        groups = expander.expand(frontier, [config.expansions] * len(frontier))
        next_frontier = []
        for parent, children in zip(frontier, groups):
            expander.release(parent)
            best = max(children, key=lambda c: c.value)
            for child in children:
                if child is not best:
                    expander.release(child)
            (leaves if best.finished else next_frontier).append(best)
        frontier = next_frontier
    return finish_search(expander, leaves, config, frontier)


register(runners.tree_spec("dvts", "diverse verifier tree search: n/4 subtrees, 4 children each (--value)", dvts,
                           DVTSConfig,
                           lambda n, params: {"subtrees": runners.kept(n), "expansions": n // runners.kept(n)},
                           {"subtrees", "expansions"}), __name__)
