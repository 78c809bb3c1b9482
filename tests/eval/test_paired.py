"""Paired comparison at a budget: the difference and its bootstrap interval on hand-made per-problem
outcomes, "undecided" when the interval holds 0, p_best summing to 1 and reaching 1 for a best that
wins every resample, seeded determinism, and configurations of other problems refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from metagen.decoding import Cost
from metagen.eval.frontier import compute_optimal, format_compute_optimal, per_budget
from metagen.eval.paired import compare, percentile_interval, resample_means, win_shares
from metagen.eval.points import CurvePoint

IDS = [f"p{i}" for i in range(20)]


def point(strategy, n, outcomes, flops, model="m", ids=IDS):
    """A measured point from 0/1 outcomes per problem (accuracy their mean)."""
    scores = dict(zip(ids, map(float, outcomes)))
    return CurvePoint(strategy, n, sum(outcomes) / len(outcomes), 0.0, len(outcomes), Cost(flops=flops),
                      model=model, per_problem=scores)


def choose(points, budget, **options):
    choice = per_budget(points, [budget]).choices[0]
    affordable = [p for p in points if p.cost.flops <= budget]
    return choice, compare(choice.best, choice.runner_up, affordable, **options)


def test_a_best_right_wherever_the_runner_up_is_wins_every_resample():
    # best right on problems 0..14, runner-up on 0..9 only: every resample's difference is >= 0,
    # and > 0 unless it draws none of problems 10..14 ((15/20)^20 ≈ 0.3%: its tie splits p_best).
    best = point("self_consistency", 4, [1] * 15 + [0] * 5, 4.0)
    runner = point("greedy", 1, [1] * 10 + [0] * 10, 1.0)
    choice, paired = choose([runner, best], 10.0)
    assert choice.best is best and paired.difference == pytest.approx(0.25)
    low, high = paired.interval
    assert 0.0 < low <= 0.25 <= high and paired.undecided is False
    shares = dict((p.strategy, share) for p, share in paired.p_best)
    assert shares["self_consistency"] > 0.99 and sum(shares.values()) == pytest.approx(1.0)
    # strictly better on every problem it differs, with a difference in every resample: p_best = 1
    always = point("best_of_n", 2, [1] * 20, 2.0)
    never = point("greedy", 1, [0] * 20, 1.0)
    _, paired = choose([never, always], 2.0)
    assert paired.p_best == ((always, 1.0), (never, 0.0)) and paired.interval == (1.0, 1.0)


def test_a_difference_that_the_problems_do_not_settle_is_undecided():
    # the two disagree on 8 problems, 5 to 3: difference 0.1, but a resample often reverses it
    best = point("self_consistency", 4, [1] * 5 + [0] * 3 + [1] * 4 + [0] * 8, 4.0)
    runner = point("greedy", 1, [0] * 5 + [1] * 3 + [1] * 4 + [0] * 8, 1.0)
    choice, paired = choose([best, runner], 4.0)
    assert paired.difference == pytest.approx(0.1)
    low, high = paired.interval
    assert low < 0.0 < high and paired.undecided is True
    shares = [share for _, share in paired.p_best]
    assert sum(shares) == pytest.approx(1.0) and 0.5 < shares[0] < 1.0
    text = format_compute_optimal([best, runner], [4.0])
    assert "+0.100 [" in text and "undecided" in text
    data = json.loads(json.dumps(compute_optimal([best, runner], [4.0])))
    row = data["per_budget"][0]["paired"]
    assert row["undecided"] is True and row["difference"] == pytest.approx(0.1)
    assert [entry["strategy"] for entry in row["p_best"]] == ["self_consistency", "greedy"]


def test_p_best_splits_ties_and_sums_to_one_over_every_affordable_configuration():
    rng = np.random.default_rng(3)
    points = [point(f"s{k}", k + 1, rng.integers(0, 2, size=20), float(k + 1)) for k in range(5)]
    table = per_budget(points, [5.0])
    paired = compare(table.choices[0].best, table.choices[0].runner_up, points)
    assert len(paired.p_best) == 5 and sum(share for _, share in paired.p_best) == pytest.approx(1.0)
    twin = point("twin", 1, [1, 0] * 10, 1.0)
    copy = point("copy", 1, [1, 0] * 10, 1.0)
    assert win_shares(resample_means(np.array([[1.0, 0.0] * 10] * 2), np.random.default_rng(0))) == [0.5, 0.5]
    paired = compare(twin, copy, [twin, copy])
    assert [share for _, share in paired.p_best] == [0.5, 0.5]  # identical: always a tie
    assert paired.difference == 0.0 and paired.interval == (0.0, 0.0) and paired.undecided is True
    choice, _ = choose([twin, copy], 1.0)  # the table names the copy beside the choice instead
    assert choice.runner_up is None and choice.same == (copy,)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_may_not():
    best = point("a", 1, [1, 1, 0, 1, 0, 1, 1, 0, 1, 1] * 2, 1.0)
    runner = point("b", 1, [1, 0, 0, 1, 1, 0, 1, 0, 1, 0] * 2, 1.0)
    first = choose([best, runner], 1.0, seed=5)[1]
    assert choose([best, runner], 1.0, seed=5)[1] == first
    others = {choose([best, runner], 1.0, seed=seed, resamples=50)[1].p_best[0][1] for seed in range(6)}
    assert len(others) > 1  # the seed is what fixes them


def test_configurations_of_other_problems_or_without_scores_are_left_out_with_the_reason():
    best = point("self_consistency", 4, [1] * 15 + [0] * 5, 4.0)
    elsewhere = point("greedy", 1, [1] * 12 + [0] * 8, 1.0, ids=[f"q{i}" for i in range(20)])
    unscored = CurvePoint("best_of_n", 2, 0.5, 0.0, 20, Cost(flops=2.0))
    choice, paired = choose([best, elsewhere, unscored], 4.0)
    assert choice.runner_up is elsewhere and paired.difference is None and paired.interval is None
    assert paired.reason == ("runner-up was run on other problems (0 of its 20 shared with the best's 20): "
                             "not compared")
    assert [(p.strategy, why) for p, why in paired.skipped] == [
        ("greedy", "was run on other problems (0 of its 20 shared with the best's 20)"),
        ("best_of_n", "has no per-problem scores stored")]
    assert paired.p_best == ((best, 1.0),)
    text = format_compute_optimal([best, elsewhere, unscored], [4.0])
    assert "4e-12 TFLOPs: no paired difference, runner-up was run on other problems" in text
    assert "TFLOPs: best_of_n n=2 left out of p_best, has no per-problem scores stored" in text
    _, alone = choose([unscored], 4.0)
    assert alone.reason == "best has no per-problem scores stored: nothing to resample" and alone.p_best == ()
    assert compare(None, None, []) is None
    with pytest.raises(ValueError, match="resamples=0 is out of range"):
        compare(best, None, [best], resamples=0)


def test_percentile_interval_takes_resample_values_as_the_unpaired_bootstrap_does():
    values = np.arange(1, 101, dtype=float)  # quantiles 2.5% and 97.5%: the 3rd and the 98th values
    assert percentile_interval(values) == (3.0, 98.0)
