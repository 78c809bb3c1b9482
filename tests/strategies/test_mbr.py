"""MBR: the choice on hand-computed utility matrices, self-pair handling, equality with weighted
voting under answer agreement, costs, config checks, and a run on the real model."""

import math

import numpy as np
import pytest

from metagen.decoding import Cost
from metagen.sampling import SamplingParams
from metagen.scoring import mean_logprob
from metagen.scoring.utilities import AnswerAgreement, ChrF, EditSimilarity, Utility
from metagen.strategies import WeightedVotingConfig, weighted_voting
from metagen.strategies.mbr import MBRConfig, expected_utilities, mbr
from tests.strategies.test_voting_strategies import OUTPUTS, CannedGenerator

MATRIX = np.array([
    [3.0, 0.2, 0.9],
    [0.5, 1.0, 0.4],
    [0.8, 0.7, 1.0],
])


class FixedUtility(Utility):
    """Returns MATRIX, costing 2 model calls; records whether the diagonal was asked for."""

    def __init__(self):
        self.diagonals = []

    def matrix(self, prompt, candidates, *, diagonal=True):
        self.diagonals.append(diagonal)
        return MATRIX, Cost(model_calls=2, flops=5.0)


THREE = [("first", [-1.0]), ("second", [-1.0]), ("third", [-1.0])]


def test_expected_utilities_by_hand():
    # without self-pairs: (0.2 + 0.9) / 2, (0.5 + 0.4) / 2, (0.8 + 0.7) / 2
    np.testing.assert_allclose(expected_utilities(MATRIX), [0.55, 0.45, 0.75])
    # with them: (3 + 0.2 + 0.9) / 3, (0.5 + 1 + 0.4) / 3, (0.8 + 0.7 + 1) / 3
    np.testing.assert_allclose(expected_utilities(MATRIX, include_self=True), [4.1 / 3, 1.9 / 3, 2.5 / 3])
    with_nan = MATRIX.copy()
    np.fill_diagonal(with_nan, np.nan)
    np.testing.assert_allclose(expected_utilities(with_nan), [0.55, 0.45, 0.75])


def test_mbr_picks_the_highest_expected_utility_and_adds_the_utility_cost():
    utility = FixedUtility()
    result = mbr(CannedGenerator(THREE), "q", MBRConfig(n=3, include_self=False), utility)
    assert result.text == "third"
    assert [c.score for c in result.completions] == pytest.approx([0.55, 0.45, 0.75])
    assert utility.diagonals == [False]
    assert result.cost.model_calls == 3 + 2 and result.cost.flops == 5.0
    assert result.cost.generated_tokens == 3 and result.cost.prompt_tokens_reused == 10
    # counting u(y, y) lets candidate 0's large self-utility win
    assert mbr(CannedGenerator(THREE), "q", MBRConfig(n=3), utility).text == "first"  # the default (include_self=True)


def test_mbr_with_answer_agreement_is_weighted_voting():
    voting = weighted_voting(CannedGenerator(OUTPUTS), "q", WeightedVotingConfig(n=5, math=True))
    utility = AnswerAgreement(mean_logprob, exp_scores=True, math=True)
    result = mbr(CannedGenerator(OUTPUTS), "q", MBRConfig(n=5, include_self=True), utility)
    assert result.chosen.text == voting.chosen.text == "so the answer is 1/2"
    # Ū_i = (1/N) · the weighted vote of y_i's answer
    half, three = voting.votes["1/2"], voting.votes["3"]
    assert [c.score for c in result.completions] == pytest.approx([half / 5, half / 5, half / 5, three / 5, three / 5])


def test_without_self_pairs_answer_agreement_can_differ_from_weighted_voting():
    outputs = [("answer 7", [-0.1]), ("answer 9", [-1.0]), ("answer 9", [-1.2])]
    weight = lambda prompt, candidate: {"-0.1": 0.9, "-1.0": 0.5, "-1.2": 0.3}[str(candidate.logprobs[0])]  # noqa: E731
    voting = weighted_voting(CannedGenerator(outputs), "q", WeightedVotingConfig(n=3, exp_scores=False), weight)
    assert voting.answer == "7"  # 0.9 > 0.5 + 0.3
    utility = AnswerAgreement(weight)
    assert mbr(CannedGenerator(outputs), "q", MBRConfig(n=3, include_self=True), utility).text == "answer 7"
    without = mbr(CannedGenerator(outputs), "q", MBRConfig(n=3, include_self=False), utility)
    assert without.text == "answer 9"  # each 9 gets the other's vote; the lone 7 gets none
    assert [c.score for c in without.completions] == pytest.approx([0.0, 0.15, 0.25])


def test_mbr_with_chrf_picks_the_consensus_sentence():
    import sacrebleu

    outputs = [("the cat sat on the mat", [-1.0]), ("a dog barked loudly", [-1.0]),
               ("the cat sat on a mat", [-1.0]), ("the cat is on the mat", [-1.0])]
    result = mbr(CannedGenerator(outputs), "q", MBRConfig(n=4, include_self=False), ChrF())
    texts = [t for t, _ in outputs]
    expected = [sum(sacrebleu.sentence_chrf(h, [r]).score / 100 for r in texts if r != h) / 3 for h in texts]
    assert [c.score for c in result.completions] == pytest.approx(expected)
    assert result.text == texts[int(np.argmax(expected))] == "the cat sat on the mat"
    assert mbr(CannedGenerator(outputs), "q", MBRConfig(n=4)).text == result.text  # chrF; u(y, y) = 1 shifts all


def test_bad_config_names_the_field_and_range():
    with pytest.raises(ValueError, match=r"n=1 is out of range: must be >= 2"):
        MBRConfig(n=1, include_self=False)
    with pytest.raises(ValueError, match=r"n=0 is out of range: must be >= 1"):
        MBRConfig(n=0)
    assert MBRConfig(n=1).n == 1


@pytest.mark.slow
def test_mbr_on_the_real_model(model):
    from metagen.decoding import LocalGenerator

    config = MBRConfig(n=4, params=SamplingParams(temperature=0.8, max_tokens=16, seed=0))
    result = mbr(LocalGenerator(model), "Name a color.", config, EditSimilarity())
    assert len(result.completions) == 4 and result.chosen in result.completions
    assert result.chosen.score == max(c.score for c in result.completions)
    assert all(0.0 <= c.score <= 1.0 for c in result.completions)
    assert result.cost.generated_tokens > 0 and result.cost.flops > 0
    assert math.isfinite(result.chosen.score)
