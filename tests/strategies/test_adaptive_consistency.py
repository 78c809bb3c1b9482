"""Adaptive self-consistency: stopping times known exactly from the Beta rule, rounds and their
cost, the registry entry, and its evaluation from a pool read in order."""

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval.pool import Pool, PoolGenerator, Sample
from metagen.sampling import SamplingParams
from metagen.strategies.adaptive_consistency import AdaptiveConsistencyConfig, adaptive_consistency
from metagen.strategies.registry import StrategyOptions, get_strategy


class Scripted(Generator):
    """Answers from a fixed script, in order, across calls; each call costs one model call."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def generate(self, prompt, params, *, generator=None):
        self.calls.append(params.n)
        served, self.answers = self.answers[:params.n], self.answers[params.n:]
        assert len(served) == params.n, "the strategy drew more than the script holds"
        completions = [Completion(f"The answer is {a}", [1, 2], [-0.1, -0.1], finish_reason="stop") for a in served]
        return GenerationResult(completions, [], cost=Cost(model_calls=1, generated_tokens=2 * params.n, flops=1.0))


def _run(answers, **config):
    generator = Scripted(answers)
    result = adaptive_consistency(generator, "q", AdaptiveConsistencyConfig(**config))
    return result, generator.calls


def test_unanimous_answers_stop_after_four():
    # P(p1 > p2 | 3, 0) = 15/16 < 0.95 <= 31/32 = P(p1 > p2 | 4, 0)
    result, calls = _run(["7"] * 16)
    assert len(result.completions) == 4 and calls == [1, 1, 1, 1]
    assert result.answer == "7" and result.votes == {"7": 4.0}
    assert result.cost.model_calls == 4 and result.cost.generated_tokens == 8 and result.cost.flops == 4.0


def test_one_dissent_delays_the_stop_to_seven():
    # counts after k: (4, 1) -> 57/64, (5, 1) -> 120/128 = 0.9375, (6, 1) -> 247/256 >= 0.95
    result, _ = _run(["1", "1", "2", "1", "1", "1", "1", "1"])
    assert len(result.completions) == 7 and result.votes == {"1": 6.0, "2": 1.0}


def test_a_split_vote_draws_n_max_and_returns_the_majority():
    result, calls = _run(["1", "2"] * 4 + ["2"], n_max=9)
    assert len(result.completions) == 9 and result.answer == "2" and len(calls) == 9


def test_rounds_check_only_between_calls_and_the_last_is_cut_to_n_max():
    result, calls = _run(["7"] * 16, round_size=3)
    assert calls == [3, 3] and len(result.completions) == 6  # 3 agreeing: 15/16, not yet
    _, calls = _run(["1", "2"] * 8, n_max=5, round_size=3)
    assert calls == [3, 2]


def test_the_threshold_and_rule_move_the_stop():
    assert len(_run(["7"] * 16, threshold=0.9)[0].completions) == 3  # 15/16 >= 0.9
    # Dirichlet over three answers: the third answer's votes also threaten the lead
    beta, _ = _run(["1", "2", "3"] + ["1"] * 13, rule="beta")
    dirichlet, _ = _run(["1", "2", "3"] + ["1"] * 13, rule="dirichlet")
    assert len(dirichlet.completions) >= len(beta.completions)


def test_config_errors_name_the_field():
    for field, value, message in [("n_max", 0, "n_max=0 is out of range"), ("round_size", 0, "round_size=0"),
                                  ("threshold", 1.0, r"threshold=1.0 is out of range: must be in \(0, 1\)"),
                                  ("rule", "vote", "rule='vote' is not known; choose from beta, dirichlet"),
                                  ("mc_samples", 0, "mc_samples=0 is out of range")]:
        with pytest.raises(ValueError, match=message):
            AdaptiveConsistencyConfig(**{field: value})


def test_registry_entry_options_and_bound():
    spec = get_strategy("adaptive_consistency")
    n, options, overrides = spec.parse({"n": 12, "threshold": 0.9, "rule": "dirichlet", "round_size": 2})
    assert n == 12 and overrides == {"threshold": 0.9, "rule": "dirichlet", "round_size": 2}
    assert "n_max" not in spec.fields()  # n is n_max
    with pytest.raises(ValueError, match="metagen.n=32 is out of range: must be <= 16"):
        spec.parse({"n": 32}, "metagen.", max_n=16)
    with pytest.raises(ValueError, match=r"metagen.threshold=2 is out of range"):
        spec.parse({"threshold": 2}, "metagen.")
    generator = Scripted(["5"] * 12)
    result = spec.run(generator, "q", 12, SamplingParams(max_tokens=4), StrategyOptions(), None, overrides)
    assert result.answer == "5" and len(result.completions) == 4 and generator.calls == [2, 2]


def _pool(answers):
    samples = [Sample(f"The answer is {a}", [1, 2], [-0.1, -0.1], [], "stop", 2.0, a) for a in answers]
    return Pool(prompt_tokens=3, prompt_flops=3.0, prefill_seconds=0.0, decode_seconds=0.0, samples=samples)


def test_from_a_pool_it_reads_the_samples_in_order_each_round_a_call():
    pool = _pool(["3", "3", "4", "3", "3", "3", "3", "3"])
    served = PoolGenerator(pool, range(8), sequential=True)
    result = get_strategy("adaptive_consistency").run(served, "q", 8, SamplingParams(), StrategyOptions(), None)
    assert served.served == 7 and served.calls == 7 and result.answer == "3"  # (6, 1) after seven, as live
    assert result.cost.flops == 7 * 3.0 + 7 * 2.0  # a prefill per round, and the seven samples
    assert result.cost.prompt_tokens_computed == 7 * 3


def test_a_sequential_pool_refuses_more_than_it_holds_and_a_plain_one_a_second_call():
    pool = _pool(["1", "2", "1"])
    served = PoolGenerator(pool, [0, 1, 2], sequential=True)
    served.generate("q", SamplingParams(n=2))
    with pytest.raises(RuntimeError, match="asked for n=2 more samples, the pool subset has 1 left of 3"):
        served.generate("q", SamplingParams(n=2))
    plain = PoolGenerator(pool, [0, 1])
    plain.generate("q", SamplingParams(n=2))
    with pytest.raises(RuntimeError, match="in one generate call"):
        plain.generate("q", SamplingParams(n=2))
