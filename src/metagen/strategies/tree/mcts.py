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
from metagen.strategies.options import sizes_work
from metagen.strategies.spec import register
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.leaves import TreeConfig, _check_positive, finish_search
from metagen.strategies.tree.node import Node

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class MCTSConfig(TreeConfig):
    """iterations: select-expand-backup rounds; expansions: children per expanded node;
    exploration: c_uct; max_steps: depth limit (a node at it counts as finished)."""

    iterations: int = sizes_work(8)
    expansions: int = sizes_work(3)
    exploration: float = 1.0
    max_steps: int = sizes_work(16)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "iterations", "expansions", "max_steps")
        if self.exploration < 0:
            raise ValueError(f"exploration={self.exploration} is out of range: must be >= 0")


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
