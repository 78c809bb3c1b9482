"""A cascade across models evaluated offline from the stored pools: ask the small model first,
and the large one only when the small model's vote is not settled.

For a problem and a budget n (each n of the evaluation), one draw is

    small vote  V_s = vote(S),  S an n-subset of the small model's pool
    escalate    e = share(V_s) < τ   or (code) the chosen program fails the docstring examples
    answer      V_s if not e, else vote(L),  L an n-subset of the large model's pool
    cost        cost(S) + e · cost(L)

where share(V) = (votes of the top answer) / n, the agreement of the n samples (a sample with
no answer votes for nothing), and vote is self-consistency's majority (code_cluster's
filter-then-cluster for a code problem: its votes are cluster sizes). S and L are the subsets
the pooled strategies at n are evaluated on (`summary.subsets`, one list per problem and n,
paired draw by draw), so with τ small enough that nothing escalates the cascade's point is
exactly the small model's self_consistency point. The pools were drawn independently, so
pairing S and L by draw adds no correlation. The point's accuracy and mean cost are over
problems of the per-problem means over draws; `escalated` is the share of (problem, draw)
pairs sent to the large model, `samples` the mean samples drawn (n + escalated · n). Nothing is
generated: the cascade costs no model call beyond the pools. Time: one vote per draw and model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from metagen.decoding.cost import Cost
from metagen.eval.code_prompts import request
from metagen.eval.config import Cascade, EvalConfig
from metagen.eval.points import CurvePoint, curve_point, mean_cost
from metagen.eval.pool import Pool, PoolGenerator
from metagen.eval.summary import subsets
from metagen.eval.tasks import Problem
from metagen.strategies.registry import get_strategy


def agreement(votes: dict[str, float], n: int) -> float:
    """share(V): the top answer's votes over the n samples drawn (0 with no vote)."""
    return max(votes.values(), default=0.0) / n


def check_cascades(cascades: Sequence[Cascade], labels: Sequence[str]) -> None:
    """ValueError naming a cascade's model that is not a label of the sweep, before any model is opened."""
    for cascade in cascades:
        for role in ("small", "large"):
            name = getattr(cascade, role)
            if name not in labels:
                raise ValueError(f"cascade {role} model {name!r} is not a model of this sweep: give two of "
                                 f"{', '.join(map(repr, labels))} (--cascade SMALL,LARGE)")


def cascade_points(cascade: Cascade, pools: dict[str, dict[str, Pool]], problems: Sequence[Problem],
                   config: EvalConfig, score: Callable, modes: dict[str, str | None] | None = None) -> list[CurvePoint]:
    """One `CurvePoint` named `cascade.label` per n of `config.ns` (model "": it spans two).
    pools: model label -> problem id -> its stored pool; score(result, problem, model) -> bool,
    the harness's grading of a result voted from that model's pool; modes: model label -> its
    stored code prompt mode (`stored_mode`; None without code problems)."""
    modes = modes or {}
    examples: dict[str, object] = {}
    points = []
    for n in sorted(set(config.ns)):
        scores, costs, escalated, draws = [], [], 0, 0
        for problem in problems:
            spec = get_strategy("code_cluster" if problem.is_code else "self_consistency")
            small, large = pools[cascade.small][problem.id], pools[cascade.large][problem.id]

            def vote(model: str, pool: Pool, indices: list[int]):
                prompt, params = request(problem, config, modes.get(model))
                return spec.run(PoolGenerator(pool, indices), prompt, n, params, config.options, None)

            hits, spent = [], []
            drawn = subsets(len(small.samples), n, config.subsets, config.seed, problem.id, n)
            paired = subsets(len(large.samples), n, config.subsets, config.seed, problem.id, n)
            for first, second in zip(drawn, paired):
                result = vote(cascade.small, small, first)
                cost, model = result.cost, cascade.small
                settled = agreement(result.votes, n) >= cascade.threshold
                if settled and problem.is_code:
                    settled = _passes_examples(examples, problem, request(problem, config, modes.get(model))[0],
                                               result.output.text)
                if not settled:
                    result, model = vote(cascade.large, large, second), cascade.large
                    cost = cost + result.cost
                    escalated += 1
                hits.append(float(score(result, problem, model)))
                spent.append(cost)
                draws += 1
            scores.append(sum(hits) / len(hits))
            costs.append(mean_cost(spent))
        point = curve_point(cascade.label, n, scores, mean_cost(costs) if costs else Cost(), "", config.seed,
                            n * (1 + escalated / max(draws, 1)), [problem.id for problem in problems])
        point.escalated = escalated / max(draws, 1)
        points.append(point)
    return points


def _passes_examples(cache: dict, problem: Problem, prompt, text: str) -> bool:
    """Whether the program of `text` passes every docstring example of the problem's prompt (True
    when the prompt has none: then only the share decides). One `ExampleTests` per problem."""
    from metagen.scoring.base import prompt_text
    from metagen.scoring.example_tests import ExampleTests

    tests = cache.get(problem.id)
    if tests is None:
        tests = cache[problem.id] = ExampleTests(prompt_text(prompt))
    passed, _ = tests.score(text)
    return passed is None or passed == 1.0

