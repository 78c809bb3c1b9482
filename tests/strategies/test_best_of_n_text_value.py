"""best_of_n_value with a value that reads the text alone (the step verifier, a PRM): n samples
drawn in one call, each valued by the min over its steps, the best kept — so it runs from a
pool, and a stored pool gives the same choice as a fresh run on those samples."""

from __future__ import annotations

import pytest

from metagen.eval.pool import Pool, PoolGenerator, Sample
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions, get_strategy

STEPS = StrategyOptions(value="steps")
WRONG = "Each box holds 3 + 4 = 8 apples.\n2 x 8 = 16\nThe answer is 16."
RIGHT = "Each box holds 3 + 4 = 7 apples.\n2 x 7 = 14\nThe answer is 14."
PROSE = "Two boxes of seven apples.\nThe answer is 14."  # no equation: every step neutral (0.5)
LATE = "3 + 4 = 7\n2 x 7 = 15\nThe answer is 15."  # its second equation is wrong


def _pool(texts):
    samples = [Sample(text, [1, 2], [-0.1, -0.2], [], "stop", 2.0) for text in texts]
    return Pool(prompt_tokens=3, prompt_flops=3.0, prefill_seconds=0.0, decode_seconds=0.0, samples=samples)


def _run(texts, options=STEPS):
    served = PoolGenerator(_pool(texts), range(len(texts)))
    return get_strategy("best_of_n_value").run(served, "Two boxes of 3 + 4 apples: how many?", len(texts),
                                               SamplingParams(temperature=1.0, max_tokens=64), options, None)


def test_the_step_verifier_values_each_sample_by_its_worst_step_and_keeps_the_best():
    result = _run([WRONG, PROSE, LATE, RIGHT])
    # min over steps: WRONG 0 (3 + 4 = 8), PROSE 0.5 (no equation), LATE 0 (2 x 7 = 15), RIGHT 0.5
    # (its last step, "The answer is 14.", writes no equation: neutral)
    assert [c.score for c in result.completions] == [0.0, 0.5, 0.0, 0.5]
    assert result.chosen.text == PROSE and result.chosen.answer == "14"  # ties: the first
    assert result.cost.flops == pytest.approx(3.0 + 4 * 2.0) and result.cost.scorer_flops == 0  # no scorer FLOPs


def test_a_step_delimiter_of_the_options_splits_the_steps():
    one_line = "3 + 4 = 7; 2 x 7 = 15; The answer is 15."
    assert [c.score for c in _run([one_line], StrategyOptions(value="steps", step_delimiter=";")).completions] == [0.0]
    assert [c.score for c in _run([one_line], StrategyOptions(value="steps", step_delimiter="\n")).completions] == [0.0]
    fixed = "3 + 4 = 7; 2 x 7 = 14; The answer is 14."
    assert [c.score for c in _run([fixed], StrategyOptions(value="steps", step_delimiter=";")).completions] == [0.5]


def test_a_cut_sample_is_never_kept_over_a_complete_one():
    pool = _pool([RIGHT, PROSE])
    pool.samples[1].complete = False  # cut before its constraint accepted it
    served = PoolGenerator(pool, [1, 0])
    result = get_strategy("best_of_n_value").run(served, "q", 2, SamplingParams(temperature=1.0), STEPS, None)
    assert [c.score for c in result.completions] == [0.5, 0.5]
    assert result.chosen.text == RIGHT  # PROSE, first of the tie, was cut: the complete RIGHT is kept
