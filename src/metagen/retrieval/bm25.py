"""BM25 over a local corpus (Robertson et al. 1994; Lucene's variant), indexed by bm25s.

    score(q, d) = Σ_{t ∈ q} idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 − b + b · |d| / avgdl))
    idf(t)      = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))          (Lucene: never negative)

Lucene drops the classic numerator factor (k1 + 1): a constant, so the ranking is unchanged.
tf(t, d): occurrences of term t in passage d; |d|: its length in terms; avgdl: the mean length;
N: passages; df(t): passages containing t. A query term repeated counts once per occurrence.
Terms are `tokenize`'s: lowercased runs of letters, digits and underscores (no stemming, no stop
words, so the scores are reproducible by hand).

bm25s (Lù 2024) stores score(t, d) for every (term, passage) pair in a sparse matrix at indexing
time, so a query sums a few rows: indexing O(total terms), a query O(Σ_t df(t) + N) (N for the
top-k selection). Chosen over rank-bm25, which scores a query against every passage in Python:
on 4,000 paragraphs of docstring prose (96,522 terms; benchmarks/retrieval_bm25.py, 2 shared
cores under load) bm25s answered 100 queries in 0.016 s against rank-bm25's 0.31 s (19x), and
indexed in 0.07 s against 0.02 s (rank-bm25 only counts terms when indexing; once per corpus
here, then cached). bm25s is maintained (0.3.16, October 2026) while rank-bm25's last release,
0.2.2, dates from February 2022. Its only dependency is numpy (scipy, when present, builds the
sparse matrix).

A passage's title counts `title_weight` times (default 1): its terms are indexed that many
times before the text's. This is BM25F (Robertson, Zaragoza and Taylor 2004, "Simple BM25
extension to multiple weighted fields") with the title's term frequencies weighted before
saturation and one length normalization over the weighted length: repeating a field w times is
the weighting that paper gives. It matters where a title names what the text does not: on the
shipped World Factbook corpus (89 multihop questions, top 3) the hop-2 paragraph is found for
"What is the capital of <country>?" in 10% of questions with the title ignored (0), 26% counted
once, 63% three times and 76% five times (docs/benchmarks/retrieval-chains.md).

The index is cached on disk per corpus (`corpus.cached_index`): a second load reads it back
instead of re-indexing (`built` says which happened).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from metagen.decoding.cost import Cost
from metagen.retrieval.base import MAX_TITLE_WEIGHT, Retrieval, Retriever, check_k
from metagen.retrieval.corpus import cached_index, read_corpus

_TERM = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """The terms of `text`: lowercased runs of word characters ("Eiffel-Tower's" -> eiffel, tower, s)."""
    return _TERM.findall(text.lower())


def _bm25s():
    try:
        import bm25s
    except ImportError as error:
        from metagen.extras import missing

        raise missing("retrieval", "BM25 retrieval (bm25s)") from error
    return bm25s


class BM25Retriever(Retriever):
    """BM25 over the corpus at `path` (a .jsonl file or a directory of .txt files, `corpus.py`).

    k1: term-frequency saturation (> 0); b: length normalization in [0, 1]; title_weight: how many
    times a passage's title, when it has one, is indexed before its text (0: the title is not
    searched; the module docstring). built: whether this load indexed the corpus (False: the
    cached index was read). Passages sharing no term with the query score 0 and are not returned."""

    name = "bm25"

    def __init__(self, path: str | Path, *, k1: float = 1.5, b: float = 0.75, title_weight: int = 1) -> None:
        if not k1 > 0:
            raise ValueError(f"k1={k1!r} is out of range: must be > 0")
        if not 0 <= b <= 1:
            raise ValueError(f"b={b!r} is out of range: must be in [0, 1]")
        if isinstance(title_weight, bool) or not isinstance(title_weight, int) or \
                not 0 <= title_weight <= MAX_TITLE_WEIGHT:
            raise ValueError(f"title_weight={title_weight!r} is out of range: must be an int in "
                             f"[0, {MAX_TITLE_WEIGHT}]")
        bm25s = _bm25s()
        self.path = Path(path)
        self.passages = read_corpus(self.path)

        def build(directory: Path) -> None:
            index = bm25s.BM25(k1=k1, b=b, method="lucene")
            index.index([tokenize(f"{p.title or ''} " * title_weight + p.text) for p in self.passages],
                        show_progress=False)
            index.save(str(directory), show_progress=False)

        start = time.perf_counter()
        entry, self.built = cached_index("bm25", self.path, {"k1": k1, "b": b, "terms": _TERM.pattern,
                                                                 "title_weight": title_weight}, build)
        self.index = bm25s.BM25.load(str(entry), show_progress=False)
        self.index_seconds = time.perf_counter() - start
        if self.index.scores["num_docs"] != len(self.passages):
            raise ValueError(f"the cached index {entry} holds {self.index.scores['num_docs']} passages, the corpus "
                             f"{len(self.passages)}: delete the entry to rebuild it")

    def scores(self, query: str) -> np.ndarray:
        """score(q, d) for every passage d: (N,) float32 (all 0 when no query term is in the corpus)."""
        ids = self.index.get_tokens_ids(tokenize(query))
        if not ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        return self.index.get_scores_from_ids(ids)

    def retrieve(self, query: str, k: int) -> Retrieval:
        check_k(k)
        start = time.perf_counter()
        scores = self.scores(query)  # (N,)
        order = np.argsort(-scores, kind="stable")[:k]  # best first; ties in corpus order
        passages = [replace(self.passages[i], score=float(scores[i])) for i in order if scores[i] > 0]
        return Retrieval(passages, Cost(wall_seconds=time.perf_counter() - start))
