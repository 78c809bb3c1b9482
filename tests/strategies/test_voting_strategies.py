"""Best-of-N, self-consistency and weighted voting: exact selections on canned candidates,
math-aware answer classes, and a run on the real model through LocalGenerator."""

import math

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring import answers_match, extract_answer, mean_logprob, sum_logprob
from metagen.strategies import (
    BestOfNConfig,
    SelfConsistencyConfig,
    WeightedVotingConfig,
    best_of_n,
    self_consistency,
    weighted_voting,
)


class CannedGenerator(Generator):
    """Returns fixed completions (text, per-token logprobs); checks it is asked for n of them.
    It has no model: no certainties (FULL_DISTRIBUTIONS)."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS})

    def __init__(self, outputs):
        self.outputs = outputs
        self.requests = []

    def generate(self, prompt, params, *, generator=None):
        self.requests.append(params)
        assert params.n == len(self.outputs)
        completions = [Completion(text=text, token_ids=list(range(len(lp))), logprobs=list(lp), finish_reason="stop")
                       for text, lp in self.outputs]
        cost = Cost(model_calls=3, prompt_tokens_computed=5, prompt_tokens_reused=5 * (params.n - 1),
                    generated_tokens=sum(len(lp) for _, lp in self.outputs))
        return GenerationResult(completions, [0] * 5, cost=cost)


OUTPUTS = [
    ("so the answer is 1/2", [-0.1, -0.2]),       # mean -0.15, sum -0.3
    ("the answer is 0.5", [-2.0, -2.0, -2.0]),    # mean -2.0
    ("I get \\boxed{\\frac{1}{2}}", [-1.0]),      # mean -1.0
    ("it is 3", [-0.01, -0.01, -0.01, -0.01]),    # mean -0.01 (best), sum -0.04
    ("the answer is 3", [-3.0, -3.0]),            # mean -3.0
]


def test_best_of_n_picks_the_highest_score_and_passes_n():
    generator = CannedGenerator(OUTPUTS)
    result = best_of_n(generator, "q", BestOfNConfig(n=5), scorer=mean_logprob)
    assert result.text == "it is 3"
    assert [c.score for c in result.completions] == pytest.approx([-0.15, -2.0, -1.0, -0.01, -3.0])
    assert result.cost.prompt_tokens_reused == 20
    assert best_of_n(CannedGenerator(OUTPUTS), "q", BestOfNConfig(n=5), scorer=sum_logprob).text == "it is 3"


def test_self_consistency_counts_equivalent_math_answers_as_one():
    plain = self_consistency(CannedGenerator(OUTPUTS), "q", SelfConsistencyConfig(n=5, math=False))
    assert plain.votes == {"1/2": 1.0, "0.5": 1.0, "\\frac{1}{2}": 1.0, "3": 2.0}
    assert plain.answer == "3"
    with_math = self_consistency(CannedGenerator(OUTPUTS), "q", SelfConsistencyConfig(n=5))  # math by default
    assert with_math.votes == {"1/2": 3.0, "3": 2.0}
    assert with_math.text == "so the answer is 1/2"


def test_weighted_voting_is_argmax_of_summed_weights():
    result = weighted_voting(CannedGenerator(OUTPUTS), "q", WeightedVotingConfig(n=5, math=True))
    half = math.exp(-0.15) + math.exp(-2.0) + math.exp(-1.0)
    three = math.exp(-0.01) + math.exp(-3.0)
    assert result.votes == pytest.approx({"1/2": half, "3": three})
    assert result.answer == "1/2"  # 1.637 > 1.040 although the best single candidate says 3


def test_answer_extraction_and_matching():
    assert extract_answer("x = 2, so \\boxed{\\frac{3}{4}} and 7") == "\\frac{3}{4}"
    assert extract_answer("The answer is 1,234.") == "1234"
    assert extract_answer("we get 12 then 1,234.") == "1234"
    assert extract_answer("no digits here") is None
    assert extract_answer("it is 3, I think") == "3"
    assert extract_answer("A: yes", pattern=r"A: (\w+)") == "yes"
    assert answers_match("0.5", "\\frac{1}{2}", math=True)
    assert not answers_match("0.5", "\\frac{1}{2}")
    assert not answers_match("2", "3", math=True)
    assert answers_match(" Paris. ", "paris")


def test_a_vote_with_an_answer_too_costly_to_compare_finishes_and_counts_it_apart():
    """9^{9^{9}} against 1/2 makes sympy compute a 370-million-digit power (minutes, holding the
    interpreter; no signal stops it, and off the main thread math-verify sets none): on a worker
    thread, as in the server, the comparison is a non-match at MATH_TIMEOUT_SECONDS (5 s), so the
    tower is a class of its own and the vote goes on (120 s bounds a loaded machine)."""
    pytest.importorskip("math_verify")
    from concurrent.futures import ThreadPoolExecutor

    outputs = [("the answer is 1/2", [-1.0]), ("the answer is 9^{9^{9}}", [-1.0]), ("the answer is 0.5", [-1.0])]
    pool = ThreadPoolExecutor(1)
    try:
        vote = pool.submit(self_consistency, CannedGenerator(outputs), "q", SelfConsistencyConfig(n=3, math=True))
        result = vote.result(timeout=120)
    finally:
        pool.shutdown(wait=False)
    assert result.votes == {"1/2": 2.0, "9^{9^{9}}": 1.0} and result.answer == "1/2"


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="n=0"):
        BestOfNConfig(n=0)


@pytest.mark.slow
def test_self_consistency_on_the_real_model(model):
    from metagen.decoding import LocalGenerator

    config = SelfConsistencyConfig(n=6, params=SamplingParams(temperature=0.7, max_tokens=24, seed=0))
    result = self_consistency(LocalGenerator(model), "What is 2 + 3? Answer with a number.", config)
    assert len(result.completions) == 6
    assert result.cost.prompt_tokens_reused == 5 * result.cost.prompt_tokens_computed
    assert result.cost.flops > 0 and result.cost.generated_tokens > 0
    assert sum(result.votes.values()) == sum(c.answer is not None for c in result.completions)
    assert result.chosen in result.completions


def test_borda_voting_weights_answers_by_rank():
    from metagen.strategies import BordaVotingConfig, borda_voting

    scorer = lambda prompt, candidate: sum(candidate.logprobs) / len(candidate.logprobs)  # noqa: E731
    # ranks by mean logprob: "it is 3" 1, "1/2" 2, "\\frac" 3, "0.5" 4, "the answer is 3" 5
    result = borda_voting(CannedGenerator(OUTPUTS), "q", BordaVotingConfig(n=5, math=True, power=1.0), scorer=scorer)
    assert result.votes == pytest.approx({"1/2": 4 + 2 + 3, "3": 5 + 1})
    assert result.answer == "1/2"
    majority = borda_voting(CannedGenerator(OUTPUTS), "q", BordaVotingConfig(n=5, math=True, power=0.0), scorer=scorer)
    assert majority.votes == {"1/2": 3.0, "3": 2.0}
    with pytest.raises(ValueError, match="power=-1"):
        BordaVotingConfig(power=-1)
