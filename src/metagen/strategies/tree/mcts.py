"""Monte Carlo tree search over steps with value-model leaf evaluation (UCT; AlphaZero-style,
no rollouts).

    repeat `iterations` times:
        select:   from the root, follow argmax_c Q(c) + c_uct · sqrt(ln N(parent) / N(c))
                  down to a node without children (or a finished solution)
        expand:   sample `expansions` next steps of it (one batched expand), value each child
        backup:   every child's V is added along the path: N += 1, W += V, Q = W / N
                  (a finished solution reached by selection backs up its own V again)

Every node stays in the tree with its cache snapshot, so revisiting a deep node costs nothing.
The finished solutions of the whole tree are aggregated. O(iterations · depth) bookkeeping.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class MCTSConfig(TreeConfig):
    """The rounds, branching, c_uct and depth limit of the search (TreeConfig: the rest)."""

    iterations: int = option(8, int, "select-expand-backup rounds", low=1, sizes_work=True)
    expansions: int = option(3, int, "children per expanded node", low=1, sizes_work=True)
    exploration: float = option(1.0, float, "c_uct, the weight of the exploration term", low=0)
    max_steps: int = option(16, int, "depth limit in steps (a node at it counts as finished)", low=1, sizes_work=True)


def mcts(model, prompt: Prompt, value, config: MCTSConfig | None = None, *,
         chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    if value is None:
        raise ValueError("MCTS evaluates leaves with a value: pass a PrefixValue")
    config = config or MCTSConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    visits: dict[int, int] = {id(expander.root): 1}
    totals: dict[int, float] = {id(expander.root): expander.root.value}
    solutions: list[Node] = []

    def uct(parent: Node, child: Node) -> float:
        n = visits[id(child)]
        return totals[id(child)] / n + config.exploration * math.sqrt(math.log(visits[id(parent)]) / n)

    def backup(path: list[Node], reward: float) -> None:
        for node in path:
            visits[id(node)] = visits.get(id(node), 0) + 1
            totals[id(node)] = totals.get(id(node), 0.0) + reward

    for _ in range(config.iterations):
        path = [expander.root]
        while path[-1].children and not path[-1].finished:
            parent = path[-1]
            path.append(max(parent.children, key=lambda child: uct(parent, child)))
        leaf = path[-1]
        if leaf.finished or leaf.depth >= config.max_steps:
            backup(path, leaf.value)
            continue
        for child in expander.expand([leaf], [config.expansions])[0]:
            backup(path + [child], child.value)
            if child.finished:
                solutions.append(child)
    frontier = [n for n in _walk(expander.root) if not n.children and not n.finished and n.parent is not None]
    return finish_search(expander, solutions, config, frontier)


def _walk(root: Node):
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


register(runners.tree_spec("mcts", "MCTS: n iterations of 4 children, value leaf evaluation (--value)", mcts,
                           MCTSConfig, lambda n, params: {"iterations": n}, {"iterations"},
                           defaults={"expansions": 4}.items()), __name__)
