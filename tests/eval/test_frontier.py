"""The compute-optimal frontier, the answer per budget and the bootstrap interval: exact answers on
hand-made point sets (ties, free points, unknown costs), the bootstrap against the binomial closed
form, and the harness's report and plot carrying them."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest

from metagen.decoding import Cost
from metagen.eval import EvalConfig, evaluate
from metagen.eval.frontier import (Choice, budget_ladder, compute_optimal, format_compute_optimal, frontier,
                                   intervals_overlap, per_budget)
from metagen.eval.config import ORACLE
from metagen.eval.points import CurvePoint, bootstrap_interval
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS, DiceGenerator


def point(strategy, n, accuracy, flops, interval=None, model="m"):
    return CurvePoint(strategy, n, accuracy, 0.0, 10, Cost(flops=flops), interval, model)


# H and I tie exactly (two free models); A costs more than nothing; B is as accurate as A for more;
# C and D tie exactly; E is beaten by C; F cannot be placed; G is the dearest and best placed.
H = point("greedy", 1, 0.1, 0.0, (0.0, 0.2), model="tiny")
I = point("greedy", 1, 0.1, 0.0, (0.0, 0.2), model="tiny-copy")
A = point("greedy", 1, 0.5, 10.0, (0.3, 0.7))
B = point("self_consistency", 2, 0.5, 20.0, (0.3, 0.7))
C = point("self_consistency", 4, 0.7, 20.0, (0.5, 0.9))
D = point("best_of_n", 4, 0.7, 20.0, (0.5, 0.9))
E = point("self_consistency", 8, 0.6, 40.0, (0.4, 0.8))
F = point("greedy", 1, 0.9, None, (0.8, 1.0), model="remote")
G = point("self_consistency", 16, 0.8, 80.0, (0.6, 0.95))
POINTS = [A, B, C, D, E, F, G, H, I]


def test_frontier_keeps_ties_drops_the_dominated_and_names_the_unplaced():
    result = frontier(POINTS)
    assert result.points == (H, I, A, C, D, G)  # by increasing FLOPs; equal points in input order
    assert result.unplaced == (F,)  # never treated as free: it would have been on the frontier at 0


def _dominated(p, points):
    """The definition, pairwise: some q is as accurate or more for as many FLOPs or fewer, one strict."""
    return any(q.cost.flops <= p.cost.flops and q.accuracy >= p.accuracy
               and (q.cost.flops < p.cost.flops or q.accuracy > p.accuracy) for q in points if q is not p)


def test_frontier_is_exactly_the_undominated_points_on_random_sets_with_ties():
    rng = random.Random(0)
    for _ in range(200):
        points = [point("s", i, rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]), rng.choice([None, 0.0, 1.0, 2.0, 4.0]))
                  for i in range(rng.randint(0, 9))]
        placed = [p for p in points if p.cost.flops is not None]
        expected = {p.n for p in placed if not _dominated(p, placed)}
        result = frontier(points)
        assert {p.n for p in result.points} == expected
        assert [p.n for p in result.unplaced] == [p.n for p in points if p.cost.flops is None]
        assert [p.cost.flops for p in result.points] == sorted(p.cost.flops for p in result.points)


def test_per_budget_picks_the_most_accurate_that_fits_with_its_runner_up():
    table = per_budget(POINTS, [0, 5, 10, 20, 79.9, 80, 1000])
    assert table.choices == (
        Choice(0.0, H, I, True),  # exact tie: the first given, the other as runner-up
        Choice(5.0, H, I, True),
        Choice(10.0, A, H, False),  # [0.3, 0.7] and [0.0, 0.2] are apart
        Choice(20.0, C, D, True),  # C and D tie; B (as accurate as A) is never chosen
        Choice(79.9, C, D, True),  # E is affordable but less accurate
        Choice(80.0, G, C, True),  # a budget equal to the cost fits
        Choice(1000.0, G, C, True),  # F (0.9, unknown cost) is never taken as fitting
    )
    assert table.unplaced == (F,)
    assert per_budget(POINTS, [-0.0]).choices[0].best is H
    assert per_budget([B, A], [20]).choices == (Choice(20.0, A, B, True),)  # equally accurate: the cheaper


def test_per_budget_says_when_nothing_fits_or_an_interval_is_missing():
    cheap, dear = point("greedy", 1, 0.4, 5.0), point("self_consistency", 4, 0.6, 50.0, (0.4, 0.8))
    table = per_budget([dear, cheap], [1.0, 5.0, 50.0])
    assert table.choices == (Choice(1.0, None, None, None), Choice(5.0, cheap, None, None),
                             Choice(50.0, dear, cheap, None))  # cheap has no interval: overlap unknown
    unknown = per_budget([F], [1e30])
    assert unknown.choices == (Choice(1e30, None, None, None),) and unknown.unplaced == (F,)


def test_intervals_overlap_when_they_share_a_point():
    def with_interval(low, high):
        return point("s", 1, 0.5, 1.0, (low, high))

    low, high, touching = with_interval(0.1, 0.2), with_interval(0.8, 0.9), with_interval(0.2, 0.8)
    assert intervals_overlap(low, high) is False and intervals_overlap(high, low) is False
    assert intervals_overlap(low, touching) is True and intervals_overlap(touching, high) is True
    assert intervals_overlap(low, point("s", 1, 0.5, 1.0)) is None


def test_budget_ladder_is_log_spaced_with_exact_ends():
    points = [point("a", 1, 0.1, 1e9), point("b", 1, 0.2, 1e12), point("c", 1, 0.3, None), point("d", 1, 0.0, 0.0)]
    ladder = budget_ladder(points, rungs=4)
    assert ladder[0] == 1e9 and ladder[-1] == 1e12  # exact: the dearest point fits the last rung
    assert ladder == pytest.approx((1e9, 1e10, 1e11, 1e12))
    assert budget_ladder(points, rungs=1) == (1e12,)
    uneven = [point("a", 1, 0.1, 1.3e9), point("b", 1, 0.2, 1.9e12)]  # 1.3e9 · (1.9e12 / 1.3e9) < 1.9e12
    ladder = budget_ladder(uneven, rungs=5)
    assert ladder[-1] == 1.9e12 and per_budget(uneven, ladder).choices[-1].best is uneven[1]
    assert budget_ladder([point("a", 1, 0.1, 3.0), point("b", 2, 0.2, 3.0)]) == (3.0,)
    assert budget_ladder([point("d", 1, 0.0, 0.0)]) == (0.0,)
    assert budget_ladder([F]) == ()
    with pytest.raises(ValueError, match="rungs=0 is out of range"):
        budget_ladder(points, rungs=0)


def test_bad_points_and_budgets_are_named():
    with pytest.raises(ValueError, match=r"strategy='greedy', n=1\) has accuracy=1.5: must be in \[0, 1\]"):
        frontier([point("greedy", 1, 1.5, 1.0)])
    with pytest.raises(ValueError, match=r"has cost.flops=-1.0: must be a finite number >= 0, or None"):
        per_budget([point("greedy", 1, 0.5, -1.0)], [1.0])
    with pytest.raises(ValueError, match="budget=nan is out of range"):
        per_budget(POINTS, [float("nan")])
    with pytest.raises(ValueError, match="budget=-1 is out of range"):
        per_budget(POINTS, [-1])


def _binomial_quantile(count, p, q):
    """Smallest k with P(Binomial(count, p) <= k) >= q, and the CDF just below and at it."""
    cdf = 0.0
    for k in range(count + 1):
        below = cdf
        cdf += math.comb(count, k) * p ** k * (1 - p) ** (count - k)
        if cdf >= q:
            return k, below, cdf


def test_bootstrap_matches_the_binomial_closed_form_on_bernoulli_scores():
    """k of P problems correct: a resample's mean is exactly Binomial(P, k/P) / P, so the percentile
    interval is that law's 2.5% and 97.5% quantiles. The case is chosen with the CDF at least 0.009
    from 0.025 / 0.975 on both sides of each quantile, 8 standard errors of an empirical CDF from
    20000 resamples (sqrt(0.025 · 0.975 / 20000) = 0.0011): the answer does not hang on the seed."""
    count, correct = 40, 36
    scores = [1.0] * correct + [0.0] * (count - correct)
    low, below_low, at_low = _binomial_quantile(count, correct / count, 0.025)
    high, below_high, at_high = _binomial_quantile(count, correct / count, 0.975)
    assert (low, high) == (32, 39)
    assert 0.025 - below_low > 0.009 and at_low - 0.025 > 0.009
    assert 0.975 - below_high > 0.009 and at_high - 0.975 > 0.009
    for seed in (0, 1, 2):
        interval = bootstrap_interval(scores, np.random.default_rng(seed), resamples=20000)
        assert interval == (low / count, high / count)


def test_bootstrap_is_seeded_exact_when_degenerate_and_checks_its_arguments():
    scores = [0.0, 0.5, 1.0, 1.0, 0.25]
    assert bootstrap_interval(scores, np.random.default_rng(7)) == bootstrap_interval(scores, np.random.default_rng(7))
    assert bootstrap_interval([1.0] * 12, np.random.default_rng(0)) == (1.0, 1.0)
    for seed in range(5):  # percentiles are resample means, never interpolated between two of them
        low, high = bootstrap_interval([1.0, 0.0, 1.0, 1.0, 0.0], np.random.default_rng(seed), resamples=7)
        assert (low * 5) == pytest.approx(round(low * 5), abs=1e-9)
        assert (high * 5) == pytest.approx(round(high * 5), abs=1e-9)
    low, high = bootstrap_interval(scores, np.random.default_rng(0), resamples=1)
    assert low == high  # one resample: both quantiles are its mean
    with pytest.raises(ValueError, match="per_problem has shape"):
        bootstrap_interval([], np.random.default_rng(0))
    with pytest.raises(ValueError, match="resamples=0 is out of range"):
        bootstrap_interval(scores, np.random.default_rng(0), resamples=0)
    with pytest.raises(ValueError, match="level=1.0 is out of range"):
        bootstrap_interval(scores, np.random.default_rng(0), level=1.0)


def test_the_report_carries_intervals_the_frontier_and_the_answer_per_budget(tmp_path):
    config = EvalConfig(("greedy", "self_consistency"), ns=(1, 2, 4), params=SamplingParams(temperature=1.0))
    report = evaluate(DiceGenerator(flops=None), PROBLEMS, config, tmp_path / "unknown")
    data = json.loads(json.dumps(report.to_dict()))
    configurations = [row for row in data["results"] if row["strategy"] != ORACLE]
    assert data["frontier"] == [] and data["per_budget"] == [] and data["unplaced"] == configurations

    report = evaluate(DiceGenerator(), PROBLEMS, config, tmp_path / "known")
    data = json.loads(json.dumps(report.to_dict()))
    for row in data["results"]:
        assert {"model", "strategy", "n", "accuracy", "interval"} <= set(row) and row["cost"]["flops"] is not None
        low, high = row["interval"]
        assert 0.0 <= low <= row["accuracy"] <= high <= 1.0
    assert data["unplaced"] == [] and len(data["per_budget"]) == 8
    assert all(row in data["results"] and row["strategy"] != ORACLE for row in data["frontier"])
    assert data == json.loads(json.dumps(compute_optimal(report.configurations(), coverage=report.coverage())
                                          | {"results": data["results"]}))
    for row in data["results"]:  # every point keeps its per-problem scores, so budgets can be compared paired
        assert list(row["per_problem"]) == [problem.id for problem in PROBLEMS]
        assert sum(row["per_problem"].values()) / len(PROBLEMS) == pytest.approx(row["accuracy"])
    for row in data["per_budget"]:
        assert sum(entry["p_best"] for entry in row["paired"]["p_best"]) == pytest.approx(1.0)
        assert (row["paired"]["difference"] is None) == (row["runner_up"] is None)
    assert [CurvePoint.from_dict(row) for row in data["results"]] == report.points  # rows read back
    rerun = evaluate(DiceGenerator(), PROBLEMS, config, tmp_path / "known")
    assert [p.interval for p in rerun.points] == [p.interval for p in report.points]  # seeded


def test_the_text_names_the_frontier_the_choices_and_the_unplaced():
    text = format_compute_optimal(POINTS, [10, 80])
    assert text.splitlines()[0] == ("compute-optimal frontier: tiny greedy n=1, tiny-copy greedy n=1, m greedy n=1, "
                                    "m self_consistency n=4, m best_of_n n=4, m self_consistency n=16")
    assert "m greedy n=1: 0.500 [0.300, 0.700]" in text and "not placed (FLOPs unknown): remote greedy n=1" in text
    assert "no point could be placed" in format_compute_optimal([F])


def test_the_frontier_plot_is_written_and_matplotlib_stays_unimported(tmp_path):
    from metagen.eval.plots import plot_frontier

    path = plot_frontier(POINTS, tmp_path / "frontier.png", title="hand-made")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert plot_frontier([F], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    code = ("import sys, metagen.eval, metagen.eval.frontier, metagen.eval.plots; "
            "assert 'matplotlib' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_frontier_line_has_no_models_colour_and_long_titles_wrap():
    from matplotlib.colors import to_rgb

    from metagen.eval.plots import FRONTIER_COLOUR, _palette, wrapped
    from metagen.plotting import pyplot

    assert to_rgb(FRONTIER_COLOUR) not in [to_rgb(c) for c in _palette(pyplot())]
    title = ", ".join(["SmolLM2-135M-Instruct.Q4_1", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                       "qwen2.5-coder-1.5b-instruct-q4_k_m"])
    assert [len(line) <= 90 for line in wrapped(title).splitlines()] == [True, True]
    assert wrapped("short") == "short"


def test_rows_read_back_name_what_is_missing_or_unknown():
    row = C.to_dict()
    assert CurvePoint.from_dict(json.loads(json.dumps(row))) == C
    with pytest.raises(ValueError, match="has no field 'accuracy'"):
        CurvePoint.from_dict({k: v for k, v in row.items() if k != "accuracy"})
    with pytest.raises(ValueError, match="field 'cost' is .*'joules'.*expected an object of fields among"):
        CurvePoint.from_dict({**row, "cost": {"joules": 1.0}})


def test_points_of_models_given_prompts_differently_are_flagged_and_read_back():
    """A model whose prompts went through a chat template beside one given raw text: the frontier
    text marks each point it names and says why; one format (or none recorded) is not flagged."""
    from dataclasses import replace

    from metagen.eval.points import mixed_prompts_note

    templated, raw = replace(A, model="instruct", chat=True), replace(C, model="base", chat=False)
    note = ("! prompts differ: instruct through a chat template, base as raw text; accuracies compare prompt "
            "formats as well as models (--chat or --no-chat gives every model one format)")
    assert mixed_prompts_note([templated, raw]) == note
    text = format_compute_optimal([templated, raw, replace(F, chat=None)])
    lines = text.splitlines()
    assert lines[0] == "compute-optimal frontier: instruct greedy n=1 (chat), base self_consistency n=4 (raw)"
    where = lines.index("not placed (FLOPs unknown): remote greedy n=1")  # not recorded: no marker
    assert lines[where + 1] == note
    for same in ([templated, replace(templated, model="other")], [raw, replace(A, model="x")], [A, C]):
        assert mixed_prompts_note(same) is None and "prompts differ" not in format_compute_optimal(same)
    assert CurvePoint.from_dict(raw.to_dict()).chat is False and "chat" not in A.to_dict()


def test_a_point_scoring_as_the_best_on_every_problem_is_named_beside_it_not_as_runner_up():
    scores = {"p1": 1.0, "p2": 0.0, "p3": 1.0}
    best = CurvePoint("code_cluster", 4, 2 / 3, 0.0, 10, Cost(flops=20.0), (0.3, 1.0), "m", per_problem=scores)
    twin = CurvePoint("adaptive_code_cluster", 4, 2 / 3, 0.0, 10, Cost(flops=20.0), (0.3, 1.0), "m",
                      per_problem=dict(scores))
    other = CurvePoint("best_of_n_value", 4, 1 / 3, 0.0, 10, Cost(flops=20.0), (0.0, 0.7), "m",
                       per_problem={"p1": 1.0, "p2": 0.0, "p3": 0.0})
    table = per_budget([best, twin, other], [20.0])
    assert table.choices == (Choice(20.0, best, other, True, (twin,)),)
    result = compute_optimal([best, twin, other], budgets=[20.0], resamples=200)
    row = result["per_budget"][0]
    assert [r["strategy"] for r in row["same_as_best"]] == ["adaptive_code_cluster"]
    assert row["runner_up"]["strategy"] == "best_of_n_value"
    assert {r["strategy"] for r in row["paired"]["p_best"]} == {"code_cluster", "best_of_n_value"}
    assert row["paired"]["difference"] == pytest.approx(1 / 3)
    text = format_compute_optimal([best, twin, other], budgets=[20.0], resamples=200)
    assert "m code_cluster n=4: 0.667 [0.300, 1.000]; the same on every problem: m adaptive_code_cluster n=4" in text
    # a point without per-problem scores is never taken for the same
    assert per_budget([point("a", 1, 0.5, 1.0), point("b", 1, 0.5, 1.0)], [1.0]).choices[0].same == ()


def _drawn(monkeypatch):
    """The figures a plot function closes, kept for inspection (drawn off-screen, then closed)."""
    from metagen.plotting import pyplot

    plt, figures = pyplot(), []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: figures.append(figure) or close(figure))
    return figures


def _legend_outside(axis) -> bool:
    """Whether the axis's legend lies wholly to the right of its plotting area."""
    figure = axis.figure
    figure.canvas.draw()
    return axis.get_legend().get_window_extent().x0 >= axis.get_window_extent().x1


def test_the_frontier_legend_names_a_cascade_and_hides_no_point(tmp_path, monkeypatch):
    """Regression: a cascade's points (model "": they span two models) were coloured as
    "(unnamed model)", and the legend sat inside the axes over the sweep's points."""
    from metagen.eval.plots import plot_frontier

    figures = _drawn(monkeypatch)
    cascade = point("cascade(tiny→m, τ 0.6)", 4, 0.6, 15.0, (0.4, 0.8), model="")
    plot_frontier([A, C, G, H, cascade], tmp_path / "frontier.png")
    axis = figures[-1].axes[0]
    labels = [text.get_text() for text in axis.get_legend().get_texts()]
    assert "across models (cascades)" in labels and "(unnamed model)" not in labels
    assert "cascade(tiny→m, τ 0.6)" in labels and _legend_outside(axis)


def test_the_curves_legend_names_each_strategy_and_model_once(tmp_path, monkeypatch):
    """With several models the lines are coloured by strategy and styled by model; the legend
    names each strategy and each model once (not every pair: 3 models × 6 strategies made 18
    entries that covered the plot), beside the axes."""
    from metagen.eval.config import EvalReport
    from metagen.eval.plots import plot_curves

    figures = _drawn(monkeypatch)
    def drawn(strategy, n, model):
        return CurvePoint(strategy, n, 0.1 * n, 0.0, 10, Cost(generated_tokens=100 * n, flops=10.0 * n), None, model)

    points = [drawn(strategy, n, model) for model in ("small", "large")
              for strategy in ("self_consistency", "best_of_n", ORACLE) for n in (1, 4)]
    points += [drawn("cascade(small→large, τ 0.6)", n, "") for n in (1, 4)]
    plot_curves(EvalReport(points), tmp_path)
    axis = figures[-1].axes[0]
    labels = [text.get_text() for text in axis.get_legend().get_texts()]
    assert labels == ["self_consistency", "best_of_n", f"{ORACLE} (oracle)", "cascade(small→large, τ 0.6)",
                      "small", "large", "across models (cascades)"]
    assert len(axis.get_lines()) == 7 and _legend_outside(axis)
    styles = dict(zip(labels, (handle.get_linestyle() for handle in axis.get_legend().legend_handles)))
    assert len({styles["small"], styles["large"], styles["across models (cascades)"]}) == 3
