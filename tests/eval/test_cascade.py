"""A cascade across models evaluated from stored pools (`eval/cascade.py`): accuracy, FLOPs and
escalation rate against a hand computation; the point equal to the small model's vote when
nothing escalates; bad cascades refused by name."""

from __future__ import annotations

import pytest

from metagen.eval import EvalConfig, Problem, format_table
from metagen.eval.cascade import agreement, cascade_points, check_cascades
from metagen.eval.config import Cascade
from metagen.eval.judging import score
from metagen.eval.points import CurvePoint
from metagen.eval.pool import Pool, Sample
from metagen.eval.running import evaluate_models
from metagen.sampling import SamplingParams
from tests.eval.dice import PROBLEMS
from tests.eval.test_model_sweep import Models

CONFIG = EvalConfig(("self_consistency",), ns=(1, 2), params=SamplingParams(temperature=1.0))


def _pool(answers: list[str | None], prompt_flops: float, sample_flops: float) -> Pool:
    """A hand-made pool: one sample per answer ('The answer is X', or no answer for None)."""
    samples = [Sample("I cannot tell." if a is None else f"The answer is {a}", [1, 2], [-0.1, -0.1], [0.5, 0.5],
                      "stop", sample_flops) for a in answers]
    return Pool(10, prompt_flops, 0.0, 0.0, samples)


PROBLEMS_3 = [Problem("p1", "q1", "1"), Problem("p2", "q2", "2"), Problem("p3", "q3", "6")]
POOLS = {  # small: 10 FLOPs of prompt + 1 per sample; large: 100 + 10 per sample
    "small": {"p1": _pool(["1", "1"], 10, 1), "p2": _pool(["3", "4"], 10, 1), "p3": _pool(["5", None], 10, 1)},
    "large": {"p1": _pool(["1", "2"], 100, 10), "p2": _pool(["2", "2"], 100, 10), "p3": _pool(["6", "5"], 100, 10)},
}


def _points(threshold: float) -> dict[int, CurvePoint]:
    cascade = Cascade("small", "large", threshold)
    points = cascade_points(cascade, POOLS, PROBLEMS_3, CONFIG, lambda result, problem, model:
                            score(result, problem, CONFIG))
    return {point.n: point for point in points}


def test_agreement_is_the_top_answer_share_of_the_samples_drawn():
    assert agreement({"1": 2.0, "2": 1.0}, 4) == 0.5
    assert agreement({}, 3) == 0.0


def test_the_cascade_matches_a_hand_computation():
    """Pools of 2: n=1 is evaluated on the subsets [0] and [1], n=2 on the whole pool.
    n=1 (one sample: share 1 unless it has no answer): p1 right (11 FLOPs); p2 wrong (11); p3
    [0] '5' wrong (11), [1] no answer -> escalated to the large [1] '5', wrong (11 + 110):
    accuracy 1/3, FLOPs (11 + 11 + 66) / 3, escalated 1 of 6 draws.
    n=2 at τ 0.6: p1 share 1, right (12); p2 share 1/2 -> large '2','2' right (12 + 120); p3
    share 1/2 -> large '6','5' (a tie: the first seen) right (132): accuracy 1, FLOPs 92,
    escalated 2 of 3."""
    points = _points(0.6)
    assert points[1].accuracy == pytest.approx(1 / 3)
    assert points[1].cost.flops == pytest.approx((11 + 11 + 66) / 3)
    assert points[1].escalated == pytest.approx(1 / 6)
    assert points[1].samples == pytest.approx(1 + 1 / 6)
    assert points[2].accuracy == pytest.approx(1.0)
    assert points[2].cost.flops == pytest.approx((12 + 132 + 132) / 3)
    assert points[2].escalated == pytest.approx(2 / 3)
    assert points[2].strategy == "cascade(small→large, τ 0.6)"
    assert points[2].to_dict()["escalated"] == pytest.approx(2 / 3)
    assert CurvePoint.from_dict(points[2].to_dict()).escalated == pytest.approx(2 / 3)


def test_a_lower_threshold_escalates_less():
    """τ 0.5: a share of 1/2 is settled, so at n=2 nothing escalates: p1 right, p2 '3' (the
    first of a tie) wrong, p3 '5' wrong; 12 FLOPs each."""
    point = _points(0.5)[2]
    assert point.escalated == 0.0
    assert point.accuracy == pytest.approx(1 / 3)
    assert point.cost.flops == pytest.approx(12)


def test_in_a_sweep_the_cascade_that_never_escalates_is_the_small_models_vote(tmp_path):
    """At n=1 every dice sample has an answer (share 1): the cascade's point is the small
    model's self_consistency point at n=1, accuracy and FLOPs; its table reports the escalation."""
    config = EvalConfig(("self_consistency",), ns=(1, 2), params=SamplingParams(temperature=1.0),
                        cascades=(Cascade("a", "b", 0.9),))
    models = Models()
    report = evaluate_models([models.run("a"), models.run("b")], PROBLEMS, config, tmp_path)
    found = {point.key: point for point in report.points}
    cascade, small = found[("", "cascade(a→b, τ 0.9)", 1)], found[("a", "self_consistency", 1)]
    assert cascade.escalated == 0.0
    assert cascade.accuracy == small.accuracy
    assert cascade.cost.flops == pytest.approx(small.cost.flops)
    assert found[("", "cascade(a→b, τ 0.9)", 2)].escalated is not None
    assert "cascade(a→b, τ 0.9) n=1: escalated 0.0% of problems" in format_table(report)


@pytest.mark.parametrize("small, large, threshold, field", [
    ("a", "a", 0.6, "small='a' and large='a'"), ("", "b", 0.6, "small=''"),
    ("a", "b", 0.0, "threshold=0.0"), ("a", "b", 1.5, "threshold=1.5"),
])
def test_bad_cascades_are_refused_by_name(small, large, threshold, field):
    with pytest.raises(ValueError, match=field):
        Cascade(small, large, threshold)


def test_a_cascade_needs_pools_and_models_of_the_sweep():
    with pytest.raises(ValueError, match="no strategy of"):
        EvalConfig(("greedy",), ns=(1,), cascades=(Cascade("a", "b"),))
    with pytest.raises(ValueError, match="given more than once"):
        EvalConfig(("self_consistency",), ns=(1,), cascades=(Cascade("a", "b"), Cascade("a", "b")))
    with pytest.raises(ValueError, match="large model 'c' is not a model of this sweep"):
        check_cascades((Cascade("a", "c"),), ["a", "b"])


ADD = Problem("add", 'def add(a, b):\n    """The sum of a and b.\n\n    >>> add(2, 3)\n    5\n    """\n', "",
              "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add")


def _code_pool(body: str, right: bool, prompt_flops: float, sample_flops: float) -> Pool:
    """Two completion-style replies with the same body, stored graded `right`."""
    samples = [Sample(body, [1, 2], [-0.1, -0.1], [0.5, 0.5], "stop", sample_flops, correct=right) for _ in range(2)]
    return Pool(10, prompt_flops, 0.0, 0.0, samples)


@pytest.mark.parametrize("small_body, escalated", [("    return a - b\n", 1.0), ("    return a + b\n", 0.0)])
def test_a_code_problem_escalates_when_no_program_passes_the_examples(small_body, escalated):
    """The small model's two programs agree (share 1), so only the docstring example decides:
    a - b fails add(2, 3) == 5 and goes to the large model (12 + 120 FLOPs at n=2); a + b stays."""
    config = EvalConfig(("code_cluster",), ns=(2,), code_prompt="completion")
    pools = {"small": {"add": _code_pool(small_body, escalated == 0.0, 10, 1)},
             "large": {"add": _code_pool("    return a + b\n", True, 100, 10)}}
    known = {model: {sample.text: sample.correct for sample in pools[model]["add"].samples} for model in pools}
    point = cascade_points(Cascade("small", "large", 0.6), pools, [ADD], config,
                           lambda result, problem, model: known[model][result.output.text],
                           {"small": "completion", "large": "completion"})[0]
    assert point.escalated == escalated and point.accuracy == 1.0
    assert point.cost.flops == pytest.approx(12 + 120 * escalated)
