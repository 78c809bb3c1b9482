"""REBASE: reward-balanced search (Wu et al. 2024, "Inference scaling laws").

The expansion budget is shared across the frontier by a softmax of the nodes' rewards:

    W_j = round(B · exp(R_j / T) / Σ_k exp(R_k / T))

where B is the budget still open (the width minus the solutions already finished), R_j the value
of frontier node j and T the balance temperature. Node j gets W_j children (0: pruned). Every
depth is one batched expand. Small T approaches beam search; large T spreads the budget evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
class RebaseConfig(TreeConfig):
    """The budget B, the balancing temperature T and the depth limit (TreeConfig: the rest)."""

    width: int = option(8, int, "total budget B of children (solutions wanted)", low=1, sizes_work=True)
    temperature: float = option(0.2, float, "T of the softmax sharing the budget by value", above=0)
    max_steps: int = option(16, int, "depth limit in steps", low=1, sizes_work=True)


def rebase_allocation(rewards: Sequence[float], budget: int, temperature: float) -> list[int]:
    """W_j = round(budget · softmax(R / T)_j) (Python's round: halves to even). O(n)."""
    if not rewards:
        return []
    top = max(rewards)
    weights = [math.exp((r - top) / temperature) for r in rewards]  # shifted: exp never overflows
    total = sum(weights)
    return [round(budget * w / total) for w in weights]


def rebase(model, prompt: Prompt, value, config: RebaseConfig | None = None, *,
           chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    config = config or RebaseConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    frontier, leaves = [expander.root], []
    counts = [config.width]  # the root takes the whole budget
    for _ in range(config.max_steps):
        groups = expander.expand(frontier, counts)
        for node in frontier:
            expander.release(node)
        children = [c for group in groups for c in group]
        leaves += [c for c in children if c.finished]
        frontier = [c for c in children if not c.finished]
        budget = config.width - len(leaves)
        if budget <= 0 or not frontier:
            break
        counts = rebase_allocation([c.value for c in frontier], budget, config.temperature)
        if not any(counts):  # every share rounded to 0: the best node keeps the search going
            counts[max(range(len(frontier)), key=lambda j: frontier[j].value)] = 1
        for node, count in zip(frontier, counts):
            if count == 0:
                expander.release(node)
        kept = [j for j, count in enumerate(counts) if count > 0]
        frontier, counts = [frontier[j] for j in kept], [counts[j] for j in kept]
    return finish_search(expander, leaves, config, frontier)


register(runners.tree_spec("rebase", "REBASE: width n shared by softmax of values (--value)", rebase, RebaseConfig,
                           lambda n, params: {"width": n}, {"width"}), __name__)
