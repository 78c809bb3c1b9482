"""Strategies over a code prompt's docstring examples: best_of_n_value --value tests (pooled),
code_cluster (AlphaCode's clustering) and adaptive_code_cluster, on fake generators that answer
from a script (no model)."""

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval.config import EvalConfig
from metagen.eval.pool import Pool, PoolGenerator, Sample
from metagen.sampling import SamplingParams
from metagen.scoring.answers import extract_answer
from metagen.strategies.registry import StrategyOptions, check_options, get_strategy
from tests.scoring.conftest import leftovers, no_leftovers  # noqa: F401 - no sandbox process may stay behind

PROMPT = '''def double(x):
    """Double x.
    >>> double(1)
    2
    >>> double(3)
    6
    """
'''
NO_EXAMPLES = 'def double(x):\n    """Double x."""\n'
TESTS = StrategyOptions(value="tests")

RIGHT = "    return 2 * x\n"
RIGHT_TOO = "    return x + x  # the same outputs\n"
HALF = "    return x + 1\n"  # 2 for 1 (right), 4 for 3 (wrong)
WRONG = "    return 7\n"
WRONG_TOO = "    return 3 + 4\n"
BROKEN = "    return (\n"  # does not compile: joins no cluster
PROSE = "I cannot answer that."  # no code that runs: joins no cluster


class Scripted(Generator):
    """Replies from a fixed script, in order, across calls (no capabilities: plain samples)."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def generate(self, prompt, params, *, generator=None):
        self.calls.append(params.n)
        served, self.replies = self.replies[:params.n], self.replies[params.n:]
        assert len(served) == params.n, "the strategy drew more than the script holds"
        completions = [Completion(text, [1], [-0.1], finish_reason="stop") for text in served]
        return GenerationResult(completions, [], cost=Cost(model_calls=1, generated_tokens=params.n))


def _run(name, replies, prompt=PROMPT, options=StrategyOptions(), **overrides):
    generator = Scripted(replies)
    result = get_strategy(name).run(generator, prompt, len(replies), SamplingParams(max_tokens=16), options,
                                    None, overrides)
    return result, generator


def test_best_of_n_value_with_tests_keeps_the_program_passing_most_examples(no_leftovers):
    result, generator = _run("best_of_n_value", [WRONG, HALF, RIGHT, RIGHT_TOO], options=TESTS)
    assert result.chosen.text == RIGHT  # ties go to the first
    assert [c.score for c in result.completions] == [0.0, 0.5, 1.0, 1.0]
    assert generator.calls == [4]  # one call of n i.i.d. samples: no search backend needed
    assert result.cost.model_calls == 1 and result.cost.wall_seconds > 0 and result.cost.flops == 0


def test_without_examples_best_of_n_value_keeps_the_first_sample_and_scores_none():
    result, _ = _run("best_of_n_value", [WRONG, RIGHT], prompt=NO_EXAMPLES, options=TESTS)
    assert result.chosen.text == WRONG and [c.score for c in result.completions] == [None, None]


def test_best_of_n_value_with_tests_is_pooled_and_other_searches_refuse_tests():
    spec = get_strategy("best_of_n_value")
    # pooled with a value that reads the text alone; a search with the judge or a value head
    for value in ("tests", "steps", "prm:/some/checkpoint", "reward:http://127.0.0.1:9"):
        assert spec.is_pooled(StrategyOptions(value=value)), value
    for value in ("judge", "/some/head.safetensors"):
        assert not spec.is_pooled(StrategyOptions(value=value)), value
    assert not get_strategy("rebase").is_pooled(StrategyOptions(value="steps"))
    assert EvalConfig(("best_of_n_value",), ns=(1, 4), options=TESTS).pool_size == 4
    assert EvalConfig(("rebase", "greedy"), ns=(1, 4), options=StrategyOptions(value="steps")).pool_size == 0
    with pytest.raises(ValueError, match="value='tests' scores whole answers only, but step_beam value partial"):
        check_options(["best_of_n_value", "step_beam"], TESTS)
    from metagen.strategies.tree.runner import make_value

    with pytest.raises(ValueError, match="value='tests' scores whole answers only"):
        make_value("tests", None, PROMPT, "\n")
    with pytest.raises(ValueError, match="aggregation='majority' applies to the leaves of a tree search"):
        _run("best_of_n_value", [RIGHT], options=StrategyOptions(value="tests", aggregation="majority"))


def test_from_a_pool_each_subset_is_scored_with_its_own_cost(no_leftovers):
    samples = [Sample(text, [1], [-0.1], [], "stop", 2.0) for text in (WRONG, RIGHT, HALF)]
    pool = Pool(prompt_tokens=3, prompt_flops=3.0, prefill_seconds=0.0, decode_seconds=0.0, samples=samples)
    spec = get_strategy("best_of_n_value")
    chosen, seconds = {}, {}
    for indices in ([0, 2], [0, 1, 2], [0]):
        result = spec.run(PoolGenerator(pool, indices), PROMPT, len(indices), SamplingParams(), TESTS, None)
        chosen[tuple(indices)], seconds[tuple(indices)] = result.chosen.text, result.cost.wall_seconds
    assert chosen == {(0, 2): HALF, (0, 1, 2): RIGHT, (0,): WRONG}
    assert all(value > 0 for value in seconds.values())  # each subset counts the runs of its own samples


def test_code_cluster_picks_from_the_largest_cluster(no_leftovers):
    # none passes both examples: every program is clustered by its outputs (the fallback):
    # {WRONG, WRONG_TOO, WRONG} 3, {HALF, HALF} 2; none for BROKEN, PROSE
    result, generator = _run("code_cluster", [BROKEN, HALF, WRONG, PROSE, HALF, WRONG_TOO, WRONG])
    assert result.chosen.text == WRONG and sorted(result.votes.values()) == [2.0, 3.0]
    assert generator.calls == [7] and result.cost.wall_seconds > 0
    assert all(len(key) == 16 for key in result.votes)  # digests of the output tuples
    # no key is left as an answer: each is extracted from the text, as best_of_n's are
    assert [c.answer for c in result.completions] == [extract_answer(c.text) for c in result.completions]


def test_code_cluster_drops_programs_that_fail_the_examples_before_clustering(no_leftovers):
    """AlphaCode's filtering: the larger cluster of wrong programs (3) loses to the two that pass."""
    result, _ = _run("code_cluster", [BROKEN, RIGHT, WRONG, HALF, PROSE, RIGHT_TOO, WRONG_TOO, WRONG])
    assert result.chosen.text == RIGHT and sorted(result.votes.values()) == [2.0]
    add = 'def add(a, b):\n    """The sum.\n    >>> add(1, 2)\n    3\n    """\n'
    replies = ["    pass\n", "    return None\n", "    return\n", "    return a + b\n", "    return b + a\n"]
    result, _ = _run("code_cluster", replies, prompt=add)
    assert result.chosen.text == "    return a + b\n" and list(result.votes.values()) == [2.0]


def test_code_cluster_ties_go_to_the_cluster_seen_first(no_leftovers):
    result, _ = _run("code_cluster", [PROSE, HALF, WRONG, HALF, WRONG_TOO])
    assert result.chosen.text == HALF and sorted(result.votes.values()) == [2.0, 2.0]
    result, _ = _run("code_cluster", [WRONG_TOO, HALF, WRONG, HALF])
    assert result.chosen.text == WRONG_TOO


def test_code_cluster_with_no_cluster_or_no_examples():
    result, _ = _run("code_cluster", [PROSE, BROKEN])  # nothing forms a cluster: the first sample
    assert result.chosen.text == PROSE and result.votes == {}
    # without examples: a majority over normalized program text (comments and layout ignored)
    replies = ["    return x + 1\n", "    return 2 * x\n", "    return 2*x  # twice\n"]
    result, _ = _run("code_cluster", replies, prompt=NO_EXAMPLES)
    assert result.chosen.text == replies[1] and sorted(result.votes.values()) == [1.0, 2.0]


def test_adaptive_code_cluster_stops_when_the_largest_cluster_is_the_majority(no_leftovers):
    # same outputs, four texts: Beta rule P(p1 > p2 | 4, 0) = 31/32 >= 0.95 stops after four
    agreeing = [RIGHT, RIGHT_TOO, "    return x * 2\n", "    return x << 1\n"] * 3
    result, generator = _run("adaptive_code_cluster", agreeing)
    assert len(result.completions) == 4 and generator.calls == [1, 1, 1, 1] and result.chosen.text == RIGHT
    # none passes: all clustered; one dissent after two: counts (5, 1) give 0.9375, (6, 1) 247/256: the stop comes at seven
    dissent = [WRONG, WRONG_TOO, HALF] + [WRONG] * 9
    result, _ = _run("adaptive_code_cluster", dissent)
    assert len(result.completions) == 7 and sorted(result.votes.values()) == [1.0, 6.0]
    # a failing program does not count once one passes: four passing ones are needed, at the fifth draw
    result, _ = _run("adaptive_code_cluster", [RIGHT, RIGHT_TOO, WRONG] + [RIGHT] * 9)
    assert len(result.completions) == 5 and list(result.votes.values()) == [4.0] and result.chosen.text == RIGHT
    result, generator = _run("adaptive_code_cluster", agreeing, round_size=3)
    assert generator.calls == [3, 3] and len(result.completions) == 6


def test_registry_entries():
    assert get_strategy("code_cluster").is_pooled(StrategyOptions())
    assert set(get_strategy("code_cluster").fields()) == {"n"}
    assert get_strategy("adaptive_code_cluster").sequential
    assert set(get_strategy("adaptive_code_cluster").fields()) == {"n", "round_size", "threshold", "rule",
                                                                   "mc_samples", "mc_seed"}


def test_the_sandbox_cpu_seconds_of_the_example_runs_are_in_the_cost_and_the_table(no_leftovers):
    """Running programs on the examples is compute the strategy spends: its sandbox CPU seconds
    are charged (`Cost.sandbox_seconds`) and shown beside the FLOPs."""
    from metagen.eval.config import EvalReport
    from metagen.eval.points import CurvePoint
    from metagen.eval.summary import format_table

    looping = "    total = 0\n    for i in range(3_000_000):\n        total += i\n    return 2 * x\n"
    result, _ = _run("code_cluster", [looping, RIGHT])
    assert result.cost.sandbox_seconds > 0.05  # the loop's CPU time, at least
    point = CurvePoint("code_cluster", 2, 1.0, 0.0, 1, result.cost)
    assert point.to_dict()["cost"]["sandbox_seconds"] == result.cost.sandbox_seconds
    table = format_table(EvalReport([point]))
    assert "sandbox s" in table.splitlines()[0] and f"{result.cost.sandbox_seconds:.2f}" in table.splitlines()[2]
    plain = format_table(EvalReport([CurvePoint("greedy", 1, 1.0, 0.0, 1, Cost())]))
    assert "sandbox" not in plain  # no program run: no column
