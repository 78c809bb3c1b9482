"""Particle filtering over steps (Puri et al. 2025, "a probabilistic inference approach to
inference-time scaling"): partial solutions are particles, resampled by their values.

    particles = N first steps
    repeat up to max_steps:
        every open particle is extended by one step            # one batched expand
        w_i ∝ exp(V_i / T) over all N particles                 # finished ones keep their V
        particles = N draws with replacement by w               # multinomial resampling
    until every particle is finished

Particles that share a node after resampling are extended independently (the node is expanded
into as many children as particles sit on it). The final particles — duplicates included, so
majority voting counts them — are aggregated.
"""

from __future__ import annotations

from collections import Counter
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
class ParticleFilterConfig(TreeConfig):
    """The particles N, the resampling temperature T and the depth limit (TreeConfig: the rest)."""

    particles: int = option(8, int, "particles N", low=1, sizes_work=True)
    temperature: float = option(0.1, float, "T of the resampling weights exp(V / T)", above=0)
    max_steps: int = option(16, int, "depth limit in steps", low=1, sizes_work=True)


def resampling_weights(values: list[float], temperature: float) -> torch.Tensor:
    """softmax(V / T): (N,) float64."""
    import torch  # here: importing the search's config imports no torch

    return torch.softmax(torch.tensor(values, dtype=torch.float64) / temperature, dim=0)


def particle_filter(model, prompt: Prompt, value, config: ParticleFilterConfig | None = None, *,
                    chat: bool | None = None, rng: torch.Generator | None = None) -> GenerationResult:
    import torch  # here: importing the search's config imports no torch

    if value is None:
        raise ValueError("particle filtering weights particles by a value: pass a PrefixValue")
    config = config or ParticleFilterConfig()
    expander = open_expander(model, prompt, config.params, config.step, value, chat=chat, generator=rng)
    particles = expander.expand([expander.root], [config.particles])[0]
    for _ in range(config.max_steps - 1):
        if all(p.finished for p in particles):
            break
        open_nodes = Counter(p for p in particles if not p.finished)  # node -> particles on it
        parents = list(open_nodes)
        groups = expander.expand(parents, [open_nodes[p] for p in parents])
        for parent in parents:
            expander.release(parent)
        particles = [p for p in particles if p.finished] + [c for group in groups for c in group]
        weights = resampling_weights([p.value for p in particles], config.temperature)
        draws = torch.multinomial(weights, config.particles, replacement=True, generator=expander.generator)
        survivors = [particles[i] for i in draws.tolist()]
        for node in set(particles) - set(survivors):
            if not node.finished:
                expander.release(node)
        particles = survivors
    leaves = [p for p in particles if p.finished]
    return finish_search(expander, leaves, config, [p for p in particles if not p.finished])


register(runners.tree_spec("particle_filter", "particle filtering with n particles (--value)", particle_filter,
                           ParticleFilterConfig, lambda n, params: {"particles": n}, {"particles"}), __name__)
