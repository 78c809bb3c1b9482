"""Utilities for minimum Bayes risk decoding: how much a hypothesis agrees with a pseudo-reference.

    U, cost = utility(prompt, candidates)    # U: (N, N), U[i][j] = u(y_i, y_j)

Row i is candidate y_i taken as the hypothesis, column j is y_j taken as a pseudo-reference
drawn from the model; MBR (`metagen.strategies.mbr`) picks argmax_i of the row means. With
`diagonal=False` the self-pairs u(y_i, y_i) are not needed: they are NaN in U, and utilities that
pay per pair (a judge) skip them.

Built in: surface overlap (`ChrF`, `Bleu`, `EditSimilarity`), answer agreement weighted by a
score (`AnswerAgreement`, which makes MBR weighted voting), sentence-embedding cosine
(`metagen.scoring.embeddings.EmbeddingCosine`) and an LLM judge
(`metagen.scoring.judge.LLMJudgeUtility`).
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from metagen.decoding.cost import Cost
from metagen.scoring.answers import AnswerExtractor, answer_reader, answers_match
from metagen.scoring.base import Scorer, as_scorer

if TYPE_CHECKING:
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion


class Utility(ABC):
    """u(hypothesis, pseudo-reference) over all pairs of one prompt's candidates."""

    name: str = "utility"

    @abstractmethod
    def matrix(
        self, prompt: Prompt, candidates: Sequence[Completion], *, diagonal: bool = True
    ) -> tuple[np.ndarray, Cost]:
        """U: (N, N) float64 with U[i][j] = u(candidates[i], candidates[j]), and the cost of
        computing it. diagonal=False: U[i][i] may be left uncomputed."""

    def __call__(
        self, prompt: Prompt, candidates: Sequence[Completion], *, diagonal: bool = True
    ) -> tuple[np.ndarray, Cost]:
        """`matrix`, checked: shape (N, N), finite values, NaN self-pairs when diagonal=False."""
        utilities, cost = self.matrix(prompt, candidates, diagonal=diagonal)
        utilities = np.array(utilities, dtype=np.float64)
        n = len(candidates)
        if utilities.shape != (n, n):
            raise ValueError(
                f"utility {self.name!r} returned shape {utilities.shape} for {n} candidates, expected ({n}, {n})"
            )
        if not diagonal:
            np.fill_diagonal(utilities, np.nan)
        needed = np.ones((n, n), dtype=bool) if diagonal else ~np.eye(n, dtype=bool)
        if not np.isfinite(utilities[needed]).all():
            raise ValueError(f"utility {self.name!r} returned non-finite values")
        return utilities, cost


def pairwise(texts: Sequence[str], function: Callable[[str, str], float], diagonal: bool = True) -> np.ndarray:
    """(N, N) matrix of function(texts[i], texts[j]); NaN on the diagonal when diagonal=False.
    Time: O(N²) calls of `function`."""
    n = len(texts)
    utilities = np.full((n, n), np.nan)
    for i, hypothesis in enumerate(texts):
        for j, reference in enumerate(texts):
            if diagonal or i != j:
                utilities[i, j] = function(hypothesis, reference)
    return utilities


def _import(module: str):
    """An optional-extra module, or an ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        from metagen.extras import missing

        raise missing("mbr", f"this MBR utility ({module.split('.')[0]})") from error


class ChrF(Utility):
    """Sentence-level chrF (Popović 2015) of hypothesis y_i against the single reference y_j,
    scaled to [0, 1]: the character n-gram F-beta score (n = 1..char_order, beta = 2 weighs
    recall twice as much as precision), averaged over n; word_order > 0 adds word n-grams (chrF++).
    Computed by sacrebleu. Time: O(N²) sentence chrF calls, each linear in the lengths."""

    name = "chrf"

    def __init__(self, char_order: int = 6, word_order: int = 0, beta: int = 2) -> None:
        self.metric = _import("sacrebleu.metrics").CHRF(char_order=char_order, word_order=word_order, beta=beta)

    def matrix(self, prompt, candidates, *, diagonal=True):
        texts = [c.text for c in candidates]
        return pairwise(texts, lambda h, r: self.metric.sentence_score(h, [r]).score / 100.0, diagonal), Cost()


class Bleu(Utility):
    """Sentence-level BLEU (Papineni et al. 2002) of y_i against the single reference y_j, scaled
    to [0, 1]: BP · exp(Σ_n (1/n_max) log p_n) with clipped n-gram precisions p_n; with effective
    order (as sacrebleu's `sentence_bleu`) n_max = min(4, the longest order with any hypothesis
    n-gram), and "exp" smoothing of zero counts. Computed by sacrebleu. Time: O(N²) sentence
    BLEU calls, each linear in the lengths."""

    name = "bleu"

    def __init__(self, tokenize: str = "13a", smooth_method: str = "exp") -> None:
        bleu = _import("sacrebleu.metrics").BLEU
        self.metric = bleu(tokenize=tokenize, smooth_method=smooth_method, effective_order=True)

    def matrix(self, prompt, candidates, *, diagonal=True):
        texts = [c.text for c in candidates]
        return pairwise(texts, lambda h, r: self.metric.sentence_score(h, [r]).score / 100.0, diagonal), Cost()


class EditSimilarity(Utility):
    """Normalized character Levenshtein similarity: 1 − d(y_i, y_j) / max(|y_i|, |y_j|), with d
    the edit distance (insert, delete, substitute each cost 1); 1 for two empty strings. Computed
    by rapidfuzz (`Levenshtein.normalized_similarity`, all pairs in one `cdist` call; symmetric).
    Time: O(N²) distances, each O(|y_i|·|y_j| / 64) with bit-parallel rows."""

    name = "edit_similarity"

    def matrix(self, prompt, candidates, *, diagonal=True):
        cdist = _import("rapidfuzz.process").cdist
        similarity = _import("rapidfuzz.distance.Levenshtein").normalized_similarity
        texts = [c.text for c in candidates]
        utilities = cdist(texts, texts, scorer=similarity, dtype=np.float64)
        return utilities, Cost()


class AnswerAgreement(Utility):
    """u(y, y') = v(y') · 1[a(y) = a(y')]: y' votes for y with its weight when they give the same
    final answer (Bertsch et al. 2023). With the self-pair included, MBR's
    expected utility of y_i is (1/N) Σ_j v(y_j)·1[a_j = a_i] = (1/N) · the weighted vote of a_i,
    so MBR returns the weighted-voting answer (majority voting when weights is None, v ≡ 1).

    Answers: the candidate's `answer` when set, else extracted from its text (`pattern` regex or
    `extractor`); a missing answer agrees with nothing. Answers are grouped into classes as
    weighted voting groups them (math-verify equality when math=True). Weights: a `Scorer` or a
    function (prompt_text, candidate) -> float; exp(score) when exp_scores; must be >= 0.
    Time: one scorer call + O(N·A) answer comparisons for A answer classes.
    """

    name = "answer_agreement"

    def __init__(
        self,
        weights: Scorer | Callable | None = None,
        *,
        exp_scores: bool = False,
        math: bool = True,
        pattern: str | None = None,
        extractor: AnswerExtractor | None = None,
    ) -> None:
        self.answer_of = answer_reader(pattern, extractor)
        self.weights = None if weights is None else as_scorer(weights)
        self.exp_scores = exp_scores
        self.math = math

    def answer_classes(self, candidates: Sequence[Completion]) -> list[int | None]:
        """Per candidate, the index of its answer class (None without an answer); each class is
        named by its first member, and an answer joins the first class it matches."""
        names: list[str] = []
        classes: list[int | None] = []
        for candidate in candidates:
            answer = self.answer_of(candidate)
            if answer is None:
                classes.append(None)
                continue
            index = next((k for k, name in enumerate(names) if answers_match(name, answer, self.math)), None)
            if index is None:
                names.append(answer)
                index = len(names) - 1
            classes.append(index)
        return classes

    def matrix(self, prompt, candidates, *, diagonal=True):
        n = len(candidates)
        weights, cost = [1.0] * n, Cost()
        if self.weights is not None:
            scores = self.weights(prompt, candidates)
            weights = [math.exp(s) if self.exp_scores else float(s) for s in scores.values]
            cost = scores.cost
        if any(w < 0 for w in weights):
            raise ValueError(
                f"answer weights {weights} include a negative one: scores must be >= 0 unless exp_scores=True"
            )
        classes = np.array([-1 if c is None else c for c in self.answer_classes(candidates)])
        same = (classes[:, None] == classes[None, :]) & (classes[:, None] >= 0)  # (N, N)
        return same * np.asarray(weights, dtype=np.float64)[None, :], cost
