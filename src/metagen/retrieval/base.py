"""The retriever interface: a query in, the k best passages out, with what the search cost.

    retriever.search("who built the Eiffel Tower", k=3)    # [Passage(id, text, score, title), ...]
    found = retriever.retrieve(query, k)                   # Retrieval(passages, cost)
    found.cost.wall_seconds                                # the time the search took

Every retriever (`BM25Retriever`, `DenseRetriever`, `HTTPRetriever`) implements `retrieve`;
`search` is its passages. Passages come best first (score descending; ties keep corpus order).
A score is the retriever's own (BM25 weight, cosine similarity, the endpoint's number): compare
scores within one retriever only. `RetrieverTool` makes a retriever a `Tool` a chain calls
inline, its answer the passages as numbered text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from metagen.decoding.cost import Cost
from metagen.tools.base import Tool, ToolError

MAX_K = 1000  # passages one search returns at most
MAX_TITLE_WEIGHT = 100  # BM25's title_weight (`bm25.py`): each unit indexes every title once more


@dataclass(frozen=True)
class Passage:
    """One retrieved passage: its corpus id, text, the retriever's score and its title (None: untitled)."""

    id: str
    text: str
    score: float
    title: str | None = None


@dataclass(frozen=True)
class Retrieval:
    """passages: best first; cost: wall_seconds of the search, plus the encoder's tokens and FLOPs
    for a dense retriever (a remote endpoint's compute is unknown: flops None)."""

    passages: list[Passage]
    cost: Cost = field(default_factory=Cost)


def check_k(k: object) -> int:
    """`k` when it is an int in [1, MAX_K], else ValueError naming it."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k={k!r} is out of range: must be an int in [1, {MAX_K}]")
    return k


class Retriever(ABC):
    """Search over passages. Subclasses implement `retrieve`; `search` returns its passages."""

    name: str = "retriever"

    @abstractmethod
    def retrieve(self, query: str, k: int) -> Retrieval:
        """The k best passages for `query` (fewer when the corpus is smaller) and the search's cost."""

    def search(self, query: str, k: int) -> list[Passage]:
        return self.retrieve(query, k).passages

    def close(self) -> None:
        """Release connections or memory (nothing by default)."""


def format_passages(passages: list[Passage], start: int = 1) -> str:
    """The tool's answer: one numbered line per passage, "[1] Title: text" ("[1] text" untitled),
    numbered from `start`."""
    if not passages:
        return "no results"
    return "\n".join(f"[{rank}] {p.title + ': ' if p.title else ''}{' '.join(p.text.split())}"
                     for rank, p in enumerate(passages, start))


class RetrieverTool(Tool):
    """A retriever as a chain's tool: the model's text is the query, the answer the k best passages
    (`format_passages`). last_cost: the cost of the last search (`Tool.last_cost`); found: every
    passage its searches returned, in order.

    distinct: each search answers with the k best passages that no earlier search of this tool
    returned (by passage id), numbered on after them, so the passages of several hops concatenate
    without repeats: it asks the retriever for k + (passages seen) at most MAX_K, and drops those
    seen (fewer than k when the corpus runs out). A search's cost is then that of the larger k.
    """

    name = "search"
    description = "searches the corpus: give a query, read the best passages"

    def __init__(self, retriever: Retriever, k: int = 3, *, distinct: bool = False) -> None:
        if not isinstance(retriever, Retriever):
            raise ValueError(f"retriever={retriever!r} must be a Retriever")
        self.retriever, self.k, self.distinct = retriever, check_k(k), distinct
        self.last_cost: Cost | None = None
        self.found: list[Passage] = []

    def run(self, text: str) -> str:
        self.last_cost = None
        query = " ".join(text.split())
        if not query:
            raise ToolError("the query is empty")
        seen = {passage.id for passage in self.found} if self.distinct else set()
        found = self.retriever.retrieve(query, min(MAX_K, self.k + len(seen)))
        self.last_cost = found.cost
        passages = [passage for passage in found.passages if passage.id not in seen][: self.k]
        start = len(self.found) + 1 if self.distinct else 1
        self.found.extend(passages)
        return format_passages(passages, start)
