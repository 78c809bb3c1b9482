"""`NgramCounts`: n-gram counts over a model's token ids and their interpolated probability.

Superposed decoding (`decoding.superposed`) scores each candidate token with an n-gram model
interpolated over orders n = 2 … N (Shen et al. 2024, §3.2):

    p_n(x | h)      = c(h, x) / c(h, ·)          h the last n − 1 tokens; 0 when c(h, ·) = 0
    p_ngram(x | h)  = Σ_n w_n · p_n(x | h)       w_n ≥ 0, one weight per order

(maximum-likelihood estimates, no smoothing: a continuation the corpus never shows after any of
the contexts gets p_ngram = 0, which is what lets the decoder filter it out). An order whose
context is longer than the tokens available contributes 0.

The counts are over the decoding model's own token ids (the corpus is tokenized with its
tokenizer), stored sparsely: `tables[n][h]` is a `Counter` of next tokens. The repository's
other n-gram structures do not fit this: `models.kgram.KGramModel` is an add-constant model
over its own symbol vocabulary with a dense (V,) count row per context (a 49k-token vocabulary
makes that 400 KB a context), and the speculative n-gram drafter (`speculative.ngram`) keeps
only the latest position of each n-gram, not counts.

Cost: building O(orders · corpus tokens) time and at most that many entries of memory; one
probability O(orders) dictionary lookups.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence


class NgramCounts:
    """Counts of every n-gram of orders `orders` (each >= 2) in the token sequences added."""

    def __init__(self, orders: Sequence[int] = (2, 3, 4, 5, 6)) -> None:
        orders = tuple(orders)
        if not orders or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in orders) \
                or len(set(orders)) != len(orders):
            raise ValueError(f"orders={orders!r} is out of range: must be distinct ints >= 2")
        self.orders = orders
        self.tables: dict[int, defaultdict[tuple[int, ...], Counter]] = {n: defaultdict(Counter) for n in orders}
        self.totals: dict[int, Counter] = {n: Counter() for n in orders}  # c(h, ·) per context
        self.tokens = 0  # tokens added, over all sequences

    @classmethod
    def from_texts(cls, tokenizer, texts: Iterable[str], orders: Sequence[int] = (2, 3, 4, 5, 6)) -> NgramCounts:
        """Counts of `texts`, each tokenized on its own (no special tokens)."""
        counts = cls(orders)
        for text in texts:
            counts.add(tokenizer.encode(text, add_special_tokens=False))
        return counts

    def add(self, ids: Sequence[int]) -> None:
        """Count every n-gram of `ids` (one sequence: no n-gram spans two calls). O(orders · len(ids))."""
        ids = [int(token) for token in ids]
        for n in self.orders:
            table, totals = self.tables[n], self.totals[n]
            for end in range(n - 1, len(ids)):
                context = tuple(ids[end - n + 1:end])
                table[context][ids[end]] += 1
                totals[context] += 1
        self.tokens += len(ids)

    def probability(self, context: Sequence[int], token: int, weights: Sequence[float]) -> float:
        """p_ngram(token | context) = Σ_n w_n · c(h_n, token) / c(h_n, ·), `weights[i]` the weight
        of `orders[i]`, h_n the last n − 1 tokens of `context`; an unseen or too-short context
        adds 0. O(orders)."""
        total = 0.0
        for n, weight in zip(self.orders, weights):
            if n - 1 > len(context) or weight == 0:
                continue
            key = tuple(context[len(context) - n + 1:])
            seen = self.totals[n].get(key)
            if seen:
                total += weight * self.tables[n][key].get(token, 0) / seen
        return total
