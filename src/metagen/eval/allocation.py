"""Compute-optimal allocation evaluated from the stored pools, against uniform n.

For a mean budget of n samples per problem (each n of the evaluation, n >= k) the total is
B = n·P for P problems. Per problem, an ordering of its pool is read as the samples drawn in
order (the pool in its stored order, then `subsets − 1` random permutations; see `pool.py`):

    first round: self-consistency on the first k        -> answer counts -> f_i (allocation.py)
    allocate(f, k, B)                                   -> n_i, Σ n_i <= B
    second round: self-consistency on the first n_i     -> correct or not

The point "self_consistency_allocated" at n is its accuracy with the mean cost per problem:
both rounds (two calls; the second's prefill only when the generator does not keep the prompt,
`Generator.keeps_prompt`, as adaptive consistency's rounds are charged), so FLOPs and tokens compare directly with
"self_consistency" at n (uniform n per problem, the same pools). `samples` is the mean Σ n_i / P
actually spent (<= n: samples no problem is expected to gain from are not spent).
Cost: per n and ordering, P·(n_max·S·K) for the success curves plus two votes per problem.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from metagen.eval.points import curve_point, mean_cost
from metagen.eval.pool import Pool, PoolGenerator
from metagen.eval.tasks import Problem
from metagen.strategies.allocation import allocate, vote_curve_from_counts
from metagen.strategies.registry import get_strategy

ALLOCATED = "self_consistency_allocated"


def _orderings(pool: Pool, count: int, *seed_parts) -> list[list[int]]:
    """The pool in stored order, then count − 1 random permutations of it (seeded)."""
    size = len(pool.samples)
    rng = random.Random("/".join(map(str, seed_parts)))
    return [list(range(size))] + [rng.sample(range(size), size) for _ in range(count - 1)]


def allocation_points(pools: dict[str, Pool], problems: Sequence[Problem], config, model: str, score,
                      decode=None, keeps_prompt: bool = False) -> list:
    """One `CurvePoint` named ALLOCATED per n of `config.ns` with n >= config.allocation_round
    (the first round k); score(result, problem) -> bool is the harness's own scoring.
    keeps_prompt: the generator reuses a repeated prompt (`Generator.keeps_prompt`), so the
    second round, which repeats the first's prompt, pays no prefill: charged as adaptive
    consistency's later rounds are (`PoolGenerator`)."""
    import numpy as np

    spec = get_strategy("self_consistency")
    k = config.allocation_round
    orderings = {p.id: _orderings(pools[p.id], config.subsets, config.seed, p.id, "order") for p in problems}

    def vote(problem: Problem, indices: list[int]):
        return spec.run(PoolGenerator(pools[problem.id], indices, decode), problem.question + config.prompt_suffix,
                        len(indices), config.params, config.options, None)

    points = []
    for n in sorted(set(config.ns)):
        if n < k:
            continue
        hits = {p.id: [] for p in problems}
        costs = {p.id: [] for p in problems}
        spent = []
        for r in range(config.subsets):
            first = {p.id: vote(p, orderings[p.id][r][:k]) for p in problems}
            rng = np.random.default_rng([config.seed, n, r])
            curves = [vote_curve_from_counts(list(first[p.id].votes.values()), len(pools[p.id].samples), rng)
                      for p in problems]
            allocation = allocate(curves, k, n * len(problems))
            for problem, n_i in zip(problems, allocation):
                order = orderings[problem.id][r]
                result, cost = first[problem.id], first[problem.id].cost
                if n_i > k:
                    result = vote(problem, order[:n_i])
                    cost = cost + pools[problem.id].subset_cost(order[k:n_i], prompt_cached=keeps_prompt)
                hits[problem.id].append(float(score(result, problem)))
                costs[problem.id].append(cost)
            spent.append(sum(allocation) / len(problems))
        scores = [sum(hits[p.id]) / len(hits[p.id]) for p in problems]
        average = mean_cost([mean_cost(costs[p.id]) for p in problems])
        points.append(curve_point(ALLOCATED, n, scores, average, model, config.seed, sum(spent) / len(spent),
                                  [p.id for p in problems]))
    return points

