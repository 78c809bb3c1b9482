"""The power law of repeated sampling, −log y = a·n^(−b): exact recovery of a and b from values the
law generates, its errors, predicted points past the largest n marked as such in the JSON and the
text, and no fit (with the reason, never an error) below 3 n values."""

from __future__ import annotations

import json
import math

import pytest

from metagen.decoding import Cost
from metagen.eval.frontier import compute_optimal, format_compute_optimal
from metagen.eval.points import ORACLE, CurvePoint
from metagen.eval.scaling_fit import fit_curves, fit_power_law, predicted_points

NS = (1, 2, 4, 8, 16)


def law(a, b, n):
    return math.exp(-a * n ** -b)


def curve(strategy, a, b, ns=NS, flops_per_sample=1e9, prompt=5e8, model="m"):
    return [CurvePoint(strategy, n, law(a, b, n), 0.0, 50, Cost(flops=prompt + flops_per_sample * n), (0.0, 1.0),
                       model) for n in ns]


@pytest.mark.parametrize(("a", "b"), [(1.2, 0.35), (3.0, 0.8), (0.4, 0.05)])
def test_values_generated_by_the_law_give_back_its_parameters(a, b):
    fit = fit_power_law(list(NS), [law(a, b, n) for n in NS])
    assert fit.a == pytest.approx(a, rel=1e-9) and fit.b == pytest.approx(b, rel=1e-9)
    assert fit.rmse == pytest.approx(0.0, abs=1e-12) and fit.leave_last_out == pytest.approx(0.0, abs=1e-12)
    assert fit.predict(64) == pytest.approx(law(a, b, 64), rel=1e-9)


def test_the_errors_measure_what_the_law_misses():
    values = [law(1.0, 0.5, n) for n in NS]
    values[-1] -= 0.05  # the largest n falls short of the law
    fit = fit_power_law(list(NS), values)
    assert fit.rmse > 0.005
    held = fit_power_law(list(NS[:-1]), values[:-1])  # exact on the first four
    assert held.a == pytest.approx(1.0) and held.b == pytest.approx(0.5)
    assert fit.leave_last_out == pytest.approx(law(1.0, 0.5, 16) - values[-1])  # predicted − measured = +0.05
    residuals = [fit.predict(n) - y for n, y in zip(NS, values)]
    assert fit.rmse == pytest.approx(math.sqrt(sum(r * r for r in residuals) / len(NS)))


def test_fewer_than_three_n_values_give_no_fit_and_say_why():
    two = fit_power_law([1, 4], [0.2, 0.4], "m", "self_consistency")
    assert two.a is None and two.b is None and two.rmse is None
    assert two.reason == "needs 3 n values or more, has 2"
    edges = fit_power_law([1, 2, 4, 8], [0.0, 0.3, 1.0, 1.0])
    assert edges.a is None and edges.reason == ("needs 3 n values or more with accuracy strictly between 0 and 1, "
                                                "has 1 (left out: n=1 (accuracy 0), n=4 (accuracy 1), "
                                                "n=8 (accuracy 1))")
    with pytest.raises(ValueError, match="no fit for m self_consistency: needs 3"):
        two.predict(8)
    with pytest.raises(ValueError, match=r"value 1.5 at n=2 is out of range: must be in \[0, 1\]"):
        fit_power_law([1, 2, 4], [0.1, 1.5, 0.3])
    with pytest.raises(ValueError, match="n=0 is out of range"):
        fit_power_law([0, 2, 4], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"ns=\[1, 2, 2\] repeats a value"):
        fit_power_law([1, 2, 2], [0.1, 0.2, 0.3])
    greedy = [CurvePoint("greedy", 1, 0.3, 0.0, 50, Cost(flops=1e9))]
    data = compute_optimal(greedy)  # no fit: reported, not raised
    assert data["scaling_fits"] == [{"model": "", "strategy": "greedy", "metric": "accuracy", "n": [1], "a": None,
                                     "b": None, "rmse": None, "leave_last_out_error": None,
                                     "trusted": False, "reason": "needs 3 n values or more, has 1"}]
    assert data["predicted_per_budget"] == []
    assert "greedy accuracy: no fit, needs 3 n values or more, has 1" in format_compute_optimal(greedy)


def test_predicted_points_are_marked_in_the_json_and_the_text_and_kept_off_the_frontier():
    voting = curve("self_consistency", 1.5, 0.3)
    coverage = curve(ORACLE, 1.0, 0.6)
    fits = fit_curves([*voting, *coverage])
    assert [(fit.strategy, fit.metric) for fit in fits] == [("self_consistency", "accuracy"), (ORACLE, "coverage")]
    extra = predicted_points(fits, voting)
    assert [p.n for p in extra] == [32, 64] and all(p.predicted and p.interval is None for p in extra)
    assert extra[1].accuracy == pytest.approx(law(1.5, 0.3, 64))
    assert extra[1].cost.flops == pytest.approx(5e8 + 64e9)  # the line in n through the measured FLOPs

    data = json.loads(json.dumps(compute_optimal(voting, coverage=coverage)))
    assert all("predicted" not in row for row in data["frontier"])  # the frontier is measured points only
    assert all("predicted" not in row["best"] for row in data["per_budget"])
    rows = data["predicted_per_budget"]
    assert len(rows) == 3 and all(row["predicted"] for row in rows)
    assert rows[-1]["best"]["predicted"] is True and rows[-1]["best"]["n"] == 64 and rows[-1]["best"]["stderr"] is None
    assert rows[-1]["budget_flops"] == pytest.approx(5e8 + 64e9)
    assert CurvePoint.from_dict(rows[-1]["best"]).predicted is True
    assert [fit["metric"] for fit in data["scaling_fits"]] == ["accuracy", "coverage"]
    assert data["scaling_fits"][1]["a"] == pytest.approx(1.0) and data["scaling_fits"][1]["b"] == pytest.approx(0.6)

    text = format_compute_optimal(voting, coverage=coverage)
    assert "past the largest n (* predicted by the fitted law, not measured; FLOPs extrapolated):" in text
    assert f"*m self_consistency n=64: {law(1.5, 0.3, 64):.3f}" in text
    assert "m pass@k coverage: a=1 b=0.6 over n=1,2,4,8,16; RMSE 0.000, leave-last-out error +0.000" in text


def test_a_fit_that_missed_its_own_last_point_predicts_nothing():
    # A cascade's accuracy on a math task: at n = 1 one sample always agrees with itself, so
    # nothing escalates (the small model's 0.02); from n = 4 nearly everything does (the large
    # model's 0.24, 0.32). Fitted without n = 16, the law through n = 1 and 4 says 0.59 there.
    jump = [CurvePoint("cascade", n, y, 0.0, 100, Cost(flops=1e11 + 3e11 * n), (0.0, 1.0), "")
            for n, y in ((1, 0.02), (4, 0.24), (16, 0.32))]
    smooth = curve("self_consistency", 1.5, 0.3, ns=(1, 4, 16))
    fits = fit_curves([*jump, *smooth])
    # the 2-point law is a line in (log n, log(−log y)): at n = 16, −log y = (−log 0.24)² / (−log 0.02)
    assert fits[0].leave_last_out == pytest.approx(math.exp(-math.log(0.24) ** 2 / -math.log(0.02)) - 0.32)
    assert fits[0].leave_last_out > 0.05 and not fits[0].trusted and fits[0].to_dict()["trusted"] is False
    assert fits[1].trusted and fits[1].to_dict()["trusted"] is True
    assert {p.strategy for p in predicted_points(fits, [*jump, *smooth])} == {"self_consistency"}
    data = compute_optimal([*jump, *smooth])
    assert all(row["best"]["strategy"] != "cascade" for row in data["predicted_per_budget"])
    text = format_compute_optimal([*jump, *smooth])
    assert "cascade accuracy: a=" in text and "too far off to predict (leave-last-out error beyond ±0.05)" in text
    assert "  m self_consistency accuracy: a=1.5 b=0.3 over n=1,4,16; RMSE 0.000, leave-last-out error +0.000" in (
        text.splitlines())  # trusted: nothing after its errors


def test_no_predicted_point_without_known_flops():
    unknown = [CurvePoint("self_consistency", n, law(1.0, 0.4, n), 0.0, 50, Cost(flops=None)) for n in NS]
    fits = fit_curves(unknown)
    assert fits[0].a == pytest.approx(1.0) and predicted_points(fits, unknown) == []


def test_curves_of_several_tasks_are_fitted_apart():
    from dataclasses import replace

    arithmetic = [replace(p, task="arithmetic") for p in curve("self_consistency", 1.0, 0.4)]
    humaneval = [replace(p, task="humaneval") for p in curve("self_consistency", 2.0, 0.7)]
    fits = fit_curves([*arithmetic, *humaneval])
    assert [(fit.task, round(fit.a, 9), round(fit.b, 9)) for fit in fits] == [("arithmetic", 1.0, 0.4),
                                                                               ("humaneval", 2.0, 0.7)]
    assert fits[0].to_dict()["task"] == "arithmetic"
    assert {p.task for p in predicted_points(fits, [*arithmetic, *humaneval])} == {"arithmetic", "humaneval"}
