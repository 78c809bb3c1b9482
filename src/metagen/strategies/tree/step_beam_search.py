"""Step-level beam search with a process reward (Snell et al. 2024).

    frontier = [root]
    repeat up to max_steps:
        children = k sampled next steps of every frontier node      # one batched expand
        finished children become solutions; the rest are ranked by V
        frontier = the beam_width best unfinished children           # the others are released
    until beam_width solutions or an empty frontier

Cost: beam_width · k steps per depth; values of every child (one batched call per depth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from metagen.decoding.result import GenerationResult
from metagen.strategies import runners
from metagen.strategies.best_of_n import best_by_text_value
from metagen.strategies.options import option
from metagen.strategies.spec import register
from metagen.strategies.tree.expander import open_expander
from metagen.strategies.tree.leaves import TreeConfig, finish_search

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt


@dataclass(frozen=True)
class StepBeamConfig(TreeConfig):
    """The beam's width and branching, and the depth limit (TreeConfig: the rest)."""

    beam_width: int = option(4, int, "nodes kept per depth (and solutions wanted)", low=1, sizes_work=True)
    expansions: int = option(4, int, "next steps sampled per kept node", low=1, sizes_work=True)
    max_steps: int = option(16, int, "depth limit in steps", low=1, sizes_work=True)


def step_beam_search(model, prompt: Prompt, value, config: StepBeamConfig | None = None, *,
                     chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    """Beam search over steps ranked by `value` (a PrefixValue); returns the aggregated leaves."""
    config = config or StepBeamConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    frontier, leaves = [expander.root], []
    for _ in range(config.max_steps):
        children = [c for group in expander.expand(frontier, [config.expansions] * len(frontier)) for c in group]
        for node in frontier:
            expander.release(node)
        leaves += [c for c in children if c.finished]
        open_children = sorted((c for c in children if not c.finished), key=lambda c: -c.value)
        frontier = open_children[: config.beam_width]
        for node in open_children[config.beam_width:]:
            expander.release(node)
        if not frontier or len(leaves) >= config.beam_width:
            break
    return finish_search(expander, leaves, config, frontier)


register(runners.tree_spec("best_of_n_value", "best of n samples by the value (--value; pooled with a value reading "
                           "the text alone: tests, steps, a PRM)", step_beam_search, StepBeamConfig,
                           lambda n, params: {"beam_width": 1, "expansions": n, "max_steps": 1,
                                              "step": runners.whole_answer_step(params)},
                           {"beam_width", "expansions", "max_steps"}, fixed_step=True, whole_answer=best_by_text_value), __name__)
register(runners.tree_spec("step_beam", "step-level beam search: n children per depth, n/4 kept (--value)",
                           step_beam_search, StepBeamConfig,
                           lambda n, params: {"beam_width": runners.kept(n), "expansions": n // runners.kept(n)},
                           {"beam_width", "expansions"}), __name__)
