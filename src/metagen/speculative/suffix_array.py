"""A suffix array over token ids: the longest suffix of a query that occurs in the text, and
the tokens that followed its occurrences (the retrieval of `rasd`).

    order            the text's suffix starts sorted lexicographically (a −1 token separates
                     documents and sorts before every token; a suffix sorts before its extensions)
    longest match    the largest L such that query[-L:] occurs with a token after it: the
                     occurrences of a pattern are one range of `order` (two binary searches),
                     and "occurs" is monotone in L, so L is binary searched too
    continuations    up to `count` occurrences spread evenly over that range, each followed by
                     up to `length` tokens (cut at a separator)

Build: prefix doubling (Manber & Myers 1993) with one sort per round, O(n log² n) time and
O(n) int64 memory; a query of length q costs O(q log n log q) token comparisons, plus O(n) for
a match whose occurrences are all at document ends (scanned for one with a follower).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["SEPARATOR", "SuffixArray"]

SEPARATOR = -1  # between documents: no match crosses it


class SuffixArray:
    """The suffix array of `tokens` (token ids >= 0 and `SEPARATOR`s), built once.

    text: the tokens as a list (comparisons slice it); order: `(n,)` int64 suffix starts in
    lexicographic order.
    """

    def __init__(self, tokens: Sequence[int]) -> None:
        self.text = [int(token) for token in tokens]
        if any(token < SEPARATOR for token in self.text):
            raise ValueError(f"tokens must be ids >= 0 or the separator {SEPARATOR}")
        self.order = suffix_order(torch.tensor(self.text, dtype=torch.long))

    def __len__(self) -> int:
        return len(self.text)

    def pattern_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the entries of `order` whose suffix starts with `pattern`. O(|p| log n)."""
        text, order, pattern = self.text, self.order, list(pattern)
        size = len(pattern)

        def first(strict: bool) -> int:  # first entry whose prefix is >= (> when strict) the pattern
            lo, hi = 0, len(order)
            while lo < hi:
                mid = (lo + hi) // 2
                start = int(order[mid])
                prefix = text[start:start + size]
                if prefix < pattern or (strict and prefix == pattern):
                    lo = mid + 1
                else:
                    hi = mid
            return lo

        return first(False), first(True)

    def _follows(self, start: int, size: int) -> bool:
        """Whether the occurrence at `start` of a `size`-token pattern has a token after it."""
        return start + size < len(self.text) and self.text[start + size] != SEPARATOR

    def _followed(self, pattern: Sequence[int]) -> tuple[int, int] | None:
        """The range of `pattern` when one occurrence has a token after it, else None."""
        lo, hi = self.pattern_range(pattern)
        if any(self._follows(int(self.order[i]), len(pattern)) for i in range(lo, hi)):
            return lo, hi
        return None

    def longest_match(self, query: Sequence[int], max_length: int) -> tuple[int, int, int]:
        """(L, lo, hi): the longest suffix of `query` (at most `max_length` tokens, no separator)
        occurring with a token after it, and its range of `order`; L = 0 when none."""
        query = list(query[-max_length:]) if max_length > 0 else []
        if SEPARATOR in query:
            query = query[len(query) - query[::-1].index(SEPARATOR):]
        best, low, high = (0, 0, 0), 1, len(query)
        while low <= high:  # query[-L:] followed somewhere is monotone in L
            middle = (low + high) // 2
            found = self._followed(query[-middle:])
            if found is None:
                high = middle - 1
            else:
                best, low = (middle, *found), middle + 1
        return best

    def continuations(self, query: Sequence[int], count: int, length: int,
                      max_match: int = 16) -> tuple[int, list[list[int]]]:
        """(L, continuations): the longest match of `query` (`longest_match`) and up to `count`
        continuations of up to `length` tokens after its occurrences, taken evenly over its range
        (the range is sorted by continuation, so even spacing samples its variety)."""
        size, lo, hi = self.longest_match(query, max_match)
        if size == 0 or count < 1 or length < 1:
            return size, []
        picks = torch.linspace(lo, hi - 1, min(count, hi - lo)).round().long().unique().tolist()
        found = []
        for i in picks:
            start = int(self.order[i]) + size
            run = self.text[start:start + length]
            if SEPARATOR in run:
                run = run[:run.index(SEPARATOR)]
            if run:
                found.append(run)
        return size, found


def suffix_order(tokens: "torch.Tensor") -> "torch.Tensor":
    """Suffix starts of `tokens (n,)` in lexicographic order, `(n,)` int64, past-the-end
    smallest. Round k sorts by (rank of the first k tokens, rank of the next k): the ranks of
    2k-token prefixes; it stops when all n ranks differ. O(n log n) per round, log n rounds."""
    n = tokens.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    rank = torch.unique(tokens, return_inverse=True)[1] + 1  # (n,), 0 kept for past-the-end
    span = 1
    while True:
        second = torch.zeros(n, dtype=torch.long)
        second[:max(0, n - span)] = rank[span:]
        key = rank * (n + 2) + second  # ranks <= n: no overflow below n ~ 3e9
        order = torch.argsort(key, stable=True)
        ordered = key[order]
        fresh = torch.ones(n, dtype=torch.long)
        fresh[1:] = (ordered[1:] != ordered[:-1]).long()
        rank = torch.empty(n, dtype=torch.long)
        rank[order] = torch.cumsum(fresh, 0)
        if int(rank.max()) == n:
            return order
        span *= 2
