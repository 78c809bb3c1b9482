"""A k-gram language model with an add-constant estimator, behind the `LanguageModel` interface.

The k-gram model with an add-constant (Laplace / Lidstone) estimator:

    p(x₁ … x_T) ≈ Π_t p(x_t | x_{t−k+1} … x_{t−1}),
    p(x | h) = (count(h, x) + c) / (count(h) + v·c)

with v the vocabulary size (every token, EOS included, is a possible next token), c > 0 the
added constant (c = 1: Laplace) and h the k − 1 previous tokens. Contexts shorter than k − 1
are padded on the left with a start symbol that is not a token, exactly as training sequences
are, so a row starts a sentence without any BOS token. An unseen context gives the uniform
distribution. Training text is split into characters or whitespace-separated words; every
training sequence ends with EOS.

Everything is exact: `conditional(context)` is the closed-form next-token distribution and
`forward` returns its logarithm as logits, so softmax(logits) == conditional. Tiny vocabularies
let tests enumerate whole sequence distributions. Cost: O(V) per token (one table row).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from metagen.models import checks
from metagen.models.base import Cache, ForwardOutput, LanguageModel, refuse_tree

EOS_PIECE = "</s>"
_START = -1  # context padding; never a token id


class SymbolTokenizer:
    """Characters (`level="char"`) or whitespace-separated words (`level="word"`) as tokens.

    Id 0 is EOS ("</s>"), the only special token; symbols follow in the given order. `encode`
    adds no special tokens (the model needs no BOS) and raises ValueError on unknown symbols.
    """

    chat_template = None

    def __init__(self, symbols: Sequence[str], level: str = "char") -> None:
        if level not in ("char", "word"):
            raise ValueError(f"level must be 'char' or 'word', got {level!r}")
        if len(set(symbols)) != len(symbols) or EOS_PIECE in symbols:
            raise ValueError("symbols must be distinct and must not contain the EOS piece")
        self.level = level
        self.pieces: tuple[str, ...] = (EOS_PIECE, *symbols)
        self._ids = {piece: i for i, piece in enumerate(self.pieces) if i > 0}
        self.eos_token_ids = (0,)
        self.vocab_size = len(self.pieces)

    def split(self, text: str) -> list[str]:
        return list(text) if self.level == "char" else text.split()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return [self._ids[symbol] for symbol in self.split(text)]
        except KeyError as error:
            raise ValueError(f"symbol {error.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        pieces = [self.pieces[int(i)] for i in ids if not (skip_special_tokens and int(i) == 0)]
        return "".join(pieces) if self.level == "char" else " ".join(pieces)


class KGramSnapshot:
    """A row's tokens kept outside the batch; restored only by the cache that made it (`owner`)."""

    __slots__ = ("owner", "released", "tokens")

    def __init__(self, tokens: tuple[int, ...], owner: KGramCache) -> None:
        self.tokens = tokens
        self.owner = owner
        self.released = False


class KGramCache(Cache):
    """Rows of token lists with the cache operations decoders use (select, fork, truncate,
    snapshots) and the same argument checks as `KVCache` (ints in range, own snapshots only)."""

    def __init__(self, batch_size: int = 1) -> None:
        self.rows: list[list[int]] = [[] for _ in range(checks.bounded("batch_size", batch_size, 0))]

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        return [len(row) for row in self.rows]

    def length(self, row: int) -> int:
        return len(self.rows[checks.row("row", row, self.batch_size)])

    def select(self, indices: Sequence[int]) -> None:
        self.rows = [list(self.rows[i]) for i in checks.rows("indices", indices, self.batch_size).tolist()]

    def fork(self, row: int, n: int) -> list[int]:
        tokens = self.rows[checks.row("row", row, self.batch_size)]
        n, first = checks.bounded("n", n, 0), self.batch_size
        self.rows += [list(tokens) for _ in range(n)]
        return list(range(first, first + n))

    def truncate(self, row: int, length: int) -> None:
        tokens = self.rows[checks.row("row", row, self.batch_size)]
        del tokens[checks.bounded("length", length, 0, len(tokens)):]

    def snapshot(self, row: int) -> KGramSnapshot:
        return KGramSnapshot(tuple(self.rows[checks.row("row", row, self.batch_size)]), self)

    def restore(self, snapshots: Sequence[KGramSnapshot]) -> None:
        snapshots = checks.snapshot_list("snapshots", snapshots, self, KGramSnapshot)
        self.rows = [list(snapshot.tokens) for snapshot in snapshots]

    def release(self, snapshot: KGramSnapshot) -> None:
        checks.snapshot("snapshot", snapshot, self, KGramSnapshot)
        snapshot.released = True

    def reset(self, batch_size: int = 1) -> None:
        self.rows = [[] for _ in range(checks.bounded("batch_size", batch_size, 0))]


class KGramModel(LanguageModel):
    """k-gram model p(x | last k − 1 tokens) = (count + c) / (context count + V·c).

    Build it with `KGramModel.train(texts, k, c, level)`; `counts` maps each seen context (a tuple
    of k − 1 ids, −1 = start padding) to its (V,) next-token counts.
    """

    def __init__(self, tokenizer: SymbolTokenizer, k: int, c: float, counts: dict, max_context: int = 256) -> None:
        if k < 1 or not c > 0:
            raise ValueError(f"need k >= 1 and c > 0, got k={k}, c={c}")
        self.tokenizer = tokenizer
        self.k, self.c = int(k), float(c)
        self.counts = counts
        self.name = f"{k}-gram ({tokenizer.level}, c={c:g})"
        self._max_context = max_context
        self._log_tables: dict[tuple[int, ...], torch.Tensor] = {}

    @classmethod
    def train(
        cls, texts: Iterable[str], k: int = 2, c: float = 1.0, level: str = "char",
        extra_symbols: Sequence[str] = (), max_context: int = 256,
    ) -> KGramModel:
        """Count k-grams of `texts` (each followed by EOS). The vocabulary is every symbol seen,
        in order of first appearance, then `extra_symbols` not seen (they get only the constant)."""
        texts = list(texts)
        splitter = SymbolTokenizer([], level)
        symbols: dict[str, None] = {}
        for text in texts:
            symbols.update(dict.fromkeys(splitter.split(text)))
        symbols.update(dict.fromkeys(s for s in extra_symbols if s not in symbols))
        tokenizer = SymbolTokenizer(list(symbols), level)
        counts: dict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.zeros(tokenizer.vocab_size))
        for text in texts:
            sequence = [_START] * (k - 1) + tokenizer.encode(text) + [0]
            for t in range(k - 1, len(sequence)):
                counts[tuple(sequence[t - k + 1 : t])][sequence[t]] += 1
        return cls(tokenizer, k, c, dict(counts), max_context)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def kv_bytes_per_token(self) -> int:
        """0: the cache keeps token ids, no keys or values."""
        return 0

    def context_of(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """The last k − 1 ids of `tokens`, left-padded with the start symbol (−1)."""
        width = self.k - 1
        if width == 0:
            return ()
        tail = [int(t) for t in tokens[-width:]]
        return tuple([_START] * (width - len(tail)) + tail)

    def conditional(self, tokens: Sequence[int]) -> np.ndarray:
        """p(· | tokens): (V,) float64, the add-constant estimate for the last k − 1 tokens."""
        count = self.counts.get(self.context_of(tokens))
        vocab = self.vocab_size
        if count is None:
            return np.full(vocab, 1.0 / vocab)
        return (count + self.c) / (count.sum() + vocab * self.c)

    def sequence_logprob(self, prompt: Sequence[int], continuation: Sequence[int]) -> float:
        """log p(continuation | prompt) = Σ_t log p(x_t | prompt + x_{<t})."""
        history = list(prompt)
        total = 0.0
        for token in continuation:
            total += float(np.log(self.conditional(history)[int(token)]))
            history.append(int(token))
        return total

    def _logits(self, tokens: Sequence[int]) -> torch.Tensor:
        context = self.context_of(tokens)
        table = self._log_tables.get(context)
        if table is None:
            table = torch.from_numpy(np.log(self.conditional(tokens))).float()  # (V,)
            self._log_tables[context] = table
        return table

    def new_cache(self, batch_size: int = 1) -> KGramCache:
        return KGramCache(batch_size)

    def flops_per_token(self, context_length: int) -> float:
        """One table row: about V operations, whatever the context length."""
        return float(self.vocab_size)

    def forward(self, cache, tokens, *, logits="last", hidden=False, tree=None) -> ForwardOutput:
        """Append tokens[b] to row b; logits = log p(next | row): (B, V) or (B, T, V) float32.
        Token trees are refused (`refuse_tree`)."""
        refuse_tree(self, tree)
        if hidden:
            raise NotImplementedError("a k-gram model has no hidden states")
        if logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
        rows = [[checks.integer(f"tokens[{b}][{i}]", t) for i, t in enumerate(row)] for b, row in enumerate(rows)]
        if len(rows) != cache.batch_size:
            raise ValueError(f"got tokens for {len(rows)} rows but the cache has {cache.batch_size} rows")
        for cached, new in zip(cache.rows, rows):  # validate everything before changing the cache
            if not new:
                raise ValueError("every row needs at least one new token")
            if any(not 0 <= token < self.vocab_size for token in new):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {new}")
            if len(cached) + len(new) > self._max_context:
                length = len(cached) + len(new)
                raise ValueError(f"row would hold {length} tokens, more than the context {self._max_context}")
        per_row = []
        for cached, new in zip(cache.rows, rows):
            steps = []
            for token in new:
                cached.append(token)
                if logits == "all" or (logits == "last" and len(steps) == len(new) - 1):
                    steps.append(self._logits(cached))
                else:
                    steps.append(None)
            per_row.append(steps)
        counts = [len(new) for new in rows]
        if logits == "none":
            return ForwardOutput(None, None, counts)
        if logits == "last":
            return ForwardOutput(torch.stack([steps[-1] for steps in per_row]), None, counts)
        padded = torch.zeros(len(rows), max(counts), self.vocab_size)  # (B, T, V)
        for b, steps in enumerate(per_row):
            padded[b, : len(steps)] = torch.stack(steps)
        return ForwardOutput(padded, None, counts)
