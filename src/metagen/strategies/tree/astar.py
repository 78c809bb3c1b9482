"""A*-decoding (Chatziveroglou et al. 2025): best-first search over partial solutions.

    f(n) = g(n) + h(n)
    g(n) = step_cost · depth(n) − β · Σ log p(tokens of n's path)     # cost so far
    h(n) = −log max(V(n), ε)                                          # PRM heuristic

A priority queue holds every generated node. Each round pops the node with the least f; a
finished solution popped is accepted (the first `solutions` of them end the search), an open
node is expanded into `expansions` children (one batched expand), valued and pushed. The budget
is `max_expansions` pops that expand. When it runs out before a solution is popped, the finished
nodes generated so far are aggregated, else the open node with the least f is returned.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.strategies import runners
from metagen.strategies.options import option
from metagen.strategies.spec import register
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.leaves import TreeConfig, finish_search
from metagen.strategies.tree.node import Node

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt

EPSILON = 1e-6


@dataclass(frozen=True)
class AStarConfig(TreeConfig):
    """The branching and budget of the search and the terms of g (TreeConfig: the rest)."""

    expansions: int = option(4, int, "children per popped node", low=1, sizes_work=True)
    max_expansions: int = option(16, int, "budget of pops that expand", low=1, sizes_work=True)
    solutions: int = option(1, int, "finished pops that end the search", low=1, sizes_work=True)
    step_cost: float = option(0.0, float, "g's cost per step (a cost, not a reward)", low=0)
    logprob_weight: float = option(0.0, float, "β, g's weight of the path's -log p (a cost, not a reward)", low=0)


def priority(node: Node, config: AStarConfig) -> float:
    """f = g + h of a valued node (see the module docstring)."""
    g = config.step_cost * node.depth - config.logprob_weight * sum(node.path_logprobs())
    return g - math.log(max(node.value, EPSILON))


def astar(model, prompt: Prompt, value, config: AStarConfig | None = None, *,
          chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    if value is None:
        raise ValueError("A*-decoding needs a value as its heuristic: pass a PrefixValue")
    config = config or AStarConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    if config.logprob_weight > 0 and not expander.has_logprobs:
        raise ValueError(f"logprob_weight={config.logprob_weight}: A*'s cost g reads −log p(path), and the backend "
                         "returns no logprobs (logprobs); use logprob_weight=0 or a backend that returns them")
    order = itertools.count()  # ties pop in insertion order
    queue = [(priority(expander.root, config), next(order), expander.root)]
    accepted: list[Node] = []
    expansions = 0
    while queue and len(accepted) < config.solutions:
        _, _, node = heapq.heappop(queue)
        if node.finished:
            accepted.append(node)
            continue
        if expansions == config.max_expansions:
            heapq.heappush(queue, (priority(node, config), next(order), node))
            break
        expansions += 1
        for child in expander.expand([node], [config.expansions])[0]:
            heapq.heappush(queue, (priority(child, config), next(order), child))
        expander.release(node)
    if not accepted:  # out of budget: finished nodes generated so far, else the best open one
        ranked = [entry[2] for entry in sorted(queue)]
        accepted = [n for n in ranked if n.finished]
        return finish_search(expander, accepted, config, ranked[:1])
    return finish_search(expander, accepted, config)


register(runners.tree_spec("astar", "A*-decoding: n expansions of 4 children (--value)", astar, AStarConfig,
                           lambda n, params: {"max_expansions": n}, {"max_expansions"},
                           defaults={"expansions": 4}.items()), __name__)
