"""One default per name: a strategy run from Python (its function and config) and the same
strategy run by name (the registry: the CLI, the server and `metagen eval`) behave alike when
nothing is set. (Every config field shared with the registry's options has the registry's default:
tests/strategies/test_options.py.)"""

from __future__ import annotations

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.strategies import BestOfNConfig, SelfConsistencyConfig, best_of_n, self_consistency
from metagen.strategies.registry import StrategyOptions, get_strategy


class Scripted(Generator):
    """Fixed completions with log-probabilities and certainties, so that mean log-probability
    and self-certainty pick different candidates."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS, caps.FULL_DISTRIBUTIONS})

    OUTPUTS = [  # (text, logprobs, certainties)
        ("the answer is 1/2", [-0.01, -0.01], [0.5, 0.5]),   # best mean logprob, lowest certainty
        ("the answer is 0.5", [-2.0, -2.0], [4.0, 4.0]),     # the most certain
        ("the answer is 3", [-1.0, -1.0], [1.0, 1.0]),
    ]

    def generate(self, prompt, params, *, generator=None):
        assert params.n == len(self.OUTPUTS)
        completions = [Completion(text=text, token_ids=[1, 2], logprobs=list(logprobs), certainties=list(certainty),
                                  finish_reason="stop") for text, logprobs, certainty in self.OUTPUTS]
        return GenerationResult(completions, [0], cost=Cost(model_calls=2, generated_tokens=6))


def test_best_of_n_by_default_is_the_registrys_best_of_n():
    params = SamplingParams(temperature=0.8, max_tokens=8)
    by_python = best_of_n(Scripted(), "q", BestOfNConfig(n=3, params=params))
    by_name = get_strategy("best_of_n").run(Scripted(), "q", 3, params, StrategyOptions(), None)
    assert by_python.text == by_name.text == "the answer is 0.5"  # self-certainty's choice
    assert [c.score for c in by_python.completions] == pytest.approx([0.5, 4.0, 1.0])


def test_self_consistency_by_default_is_the_registrys_self_consistency():
    """1/2, 0.5 are one answer as math (the default); as strings, three answers tie."""
    params = SamplingParams(temperature=0.8, max_tokens=8)
    by_python = self_consistency(Scripted(), "q", SelfConsistencyConfig(n=3, params=params))
    by_name = get_strategy("self_consistency").run(Scripted(), "q", 3, params, StrategyOptions(), None)
    assert by_python.votes == by_name.votes == {"1/2": 2.0, "3": 1.0}
