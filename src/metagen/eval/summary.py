"""From stored units to the report: `summarize` turns one model's pools and live records into
`CurvePoint`s (accuracy and mean cost per (strategy, n), the oracle coverage pass@k of its pools,
and the allocation's points when asked), and `format_table` prints a report as plain text.

A pooled strategy at budget n is run, with the library's own code, on every n-subset of the
pool when there are at most `EvalConfig.subsets` of them, else on that many random ones (seeded
by (seed, problem, n)); its accuracy on a problem is the mean over those subsets, an unbiased
estimate of running it with n fresh samples (see `pool.py`). Nothing is generated here; a code
problem's chosen reply is graded by its stored sample's grade, or in the sandbox when a strategy
built a text no sample holds (`judging.py`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from itertools import combinations

from metagen.decoding.cost import Cost
from metagen.eval.code_prompts import request, stored_mode
from metagen.eval.config import ORACLE, EvalConfig, EvalReport
from metagen.eval.judging import score
from metagen.eval.metrics import pass_at_k
from metagen.eval.points import curve_point, mean_cost, mixed_prompts_note, stable_seed
from metagen.eval.pool import PoolGenerator, known_grades
from metagen.eval.results import ModelUnits
from metagen.eval.tasks import Problem
from metagen.strategies.registry import get_strategy
from metagen.tables import Table, with_notes

CONTINUED = " (probe reused)"  # a continuation of the difficulty probe: "<strategy> (probe reused)"


def subsets(size: int, n: int, count: int, *seed_parts) -> list[list[int]]:
    """The n-subsets of a pool of `size` samples a budget n is evaluated on (sorted indices): the
    whole pool when n == size, every n-subset when there are at most `count`, else `count`
    random ones drawn from an rng seeded by `seed_parts`."""
    if n == size:
        return [list(range(size))]
    rng = random.Random(stable_seed(*seed_parts))
    if math.comb(size, n) <= count:
        return [list(c) for c in combinations(range(size), n)]
    return [sorted(rng.sample(range(size), n)) for _ in range(count)]


def summarize(results: ModelUnits, problems: Sequence[Problem], config: EvalConfig, decode=None,
              flops_estimate: str | None = None, keeps_prompt: bool = False, chat: bool | None = None,
              continue_after: int | None = None) -> EvalReport:
    """Accuracy and mean cost per (strategy, n) of one model's units, plus the oracle coverage
    pass@k of its pools; every point named by the model's label and marked with how its FLOPs
    were estimated (`flops_estimate`, None: exact or unknown) and whether its text prompts went
    through a chat template (`chat`, `CurvePoint.chat`; None: not recorded). `keeps_prompt`: the
    generator reuses a repeated prompt (`Generator.keeps_prompt`), so a strategy sampling in
    rounds pays for the prompt in its first round only. continue_after: k, this model is the
    per-difficulty policy's probe: each pooled strategy at n ≥ k is also run once on the first n
    samples of each pool in stored order (those the probe's k begin), its per-problem scores and
    FLOPs kept under (model, strategy + `CONTINUED`, n) in `per_problem` (no point)."""
    report = EvalReport()
    model = results.label
    pools = {problem.id: results.pool(problem) for problem in problems} if config.pool_size else {}
    mode = stored_mode(results)
    ids = [problem.id for problem in problems]
    known = {problem.id: known_grades(pools.get(problem.id)) for problem in problems if problem.is_code}
    for name in config.strategies:
        spec = get_strategy(name)
        budgets = sorted(set(config.ns)) if spec.budget != "none" else [1]
        continued: dict[int, tuple[list, list]] = {}
        for n in budgets:
            scores, costs, drawn = [], [], []
            for problem in problems:
                if spec.is_pooled(config.options):
                    pool = pools[problem.id]
                    hits, subset_costs = [], []
                    prompt, params = request(problem, config, mode)
                    for indices in subsets(len(pool.samples), n, config.subsets, config.seed, problem.id, n):
                        served = PoolGenerator(pool, indices, decode, sequential=spec.sequential,
                                               keeps_prompt=keeps_prompt)
                        result = spec.run(served, prompt, n, params, config.options, None)
                        hits.append(float(score(result, problem, config, known.get(problem.id))))
                        subset_costs.append(result.cost)
                        drawn.append(served.served)
                    scores.append(sum(hits) / len(hits))
                    costs.append(mean_cost(subset_costs))
                    if continue_after is not None and continue_after <= n:
                        served = PoolGenerator(pool, range(n), decode, sequential=spec.sequential,
                                               keeps_prompt=keeps_prompt)
                        result = spec.run(served, prompt, n, params, config.options, None)
                        continued.setdefault(n, ([], []))
                        continued[n][0].append(float(score(result, problem, config, known.get(problem.id))))
                        continued[n][1].append(result.cost.flops)
                else:
                    record = results.live(problem, name, n, spec.uses_value)
                    scores.append(float(record["correct"]))
                    costs.append(Cost(**record["cost"]))
            samples = sum(drawn) / len(drawn) if drawn else None
            report.points.append(curve_point(name, n, scores, mean_cost(costs), model, config.seed, samples,
                                             ids))
            report.per_problem[(model, name, n)] = (scores, [cost.flops for cost in costs])
            if n in continued:
                report.per_problem[(model, name + CONTINUED, n)] = continued.pop(n)
    if config.pool_size:
        for k in sorted(set(config.ns)):
            scores, costs = [], []
            for problem in problems:
                pool = pools[problem.id]
                right = sum(sample.correct for sample in pool.samples)
                scores.append(pass_at_k(len(pool.samples), right, k))
                costs.append(mean_cost([pool.subset_cost(i) for i in
                                        subsets(len(pool.samples), k, config.subsets, config.seed, problem.id, k)]))
            report.points.append(curve_point(ORACLE, k, scores, mean_cost(costs), model, config.seed,
                                             problem_ids=ids))
    if config.allocation_round is not None:
        from metagen.eval.allocation import allocation_points

        report.points += allocation_points(pools, problems, config, model,
                                           lambda result, problem: score(result, problem, config,
                                                                         known.get(problem.id)), decode,
                                           keeps_prompt)
    for point in report.points:
        point.chat = chat
        if flops_estimate is not None:
            point.flops_estimate = flops_estimate if point.cost.flops is not None else None
    return report


def format_table(report: EvalReport, markdown: bool = False) -> str:
    """The results table (`tables.Table`, plain text or Markdown): model (when the report holds
    several), strategy, n, accuracy [95% bootstrap interval], generated tokens, TFLOPs ("unknown"
    when the generator could not count them; "~" before an estimate, explained under the table),
    the sandbox's CPU seconds per problem (`Cost.sandbox_seconds`; only when some strategy ran
    programs), seconds per problem; under it, each cascade point's escalation rate
    (`CurvePoint.escalated`). When its models got their prompts differently
    (`mixed_prompts_note`), a "prompts" column says "chat" or "raw" per row and the note under
    the table flags it."""
    several = len(dict.fromkeys(point.model for point in report.points)) > 1
    mixed = mixed_prompts_note(report.points)
    sandbox = any(p.cost.sandbox_seconds for p in report.points)
    columns = [("model", "left")] * several + [("prompts", "left")] * bool(mixed) + [
        ("strategy", "left"), ("n", "right"), ("accuracy [95% interval]", "right"), ("gen tokens", "right"),
        ("TFLOPs", "right")] + [("sandbox s", "right")] * sandbox + [("s/problem", "right")]
    rows = []
    for p in report.points:
        interval = "" if p.interval is None else f" [{p.interval[0]:.3f}, {p.interval[1]:.3f}]"
        shown = {True: "chat", False: "raw", None: "?"}[p.chat]
        rows.append([p.model] * several + [shown] * bool(mixed) + [
            p.strategy, str(p.n), f"{p.accuracy:.3f}{interval}", f"{p.cost.generated_tokens:.1f}",
            ("~" if p.flops_estimate is not None else "") + _tflops(p.cost.flops)]
            + [f"{p.cost.sandbox_seconds:.2f}"] * sandbox + [f"{p.cost.wall_seconds:.2f}"])
    notes = [f"~ {model or 'model'}: FLOPs estimated as {estimate}" for model, estimate in
             dict.fromkeys((p.model, p.flops_estimate) for p in report.points if p.flops_estimate is not None)]
    notes += [f"{p.strategy} n={p.n}: escalated {100 * p.escalated:.1f}% of problems to the large model"
              for p in report.points if p.escalated is not None]  # a cascade's share sent to its large model
    notes += [mixed] if mixed else []
    table = Table([name for name, _ in columns], rows, [side for _, side in columns]).render(markdown)
    return with_notes(table, notes, markdown)


def _tflops(flops: float | None) -> str:
    return "unknown" if flops is None else f"{flops / 1e12:.3f}"
