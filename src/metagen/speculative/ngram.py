"""Model-free drafting: prompt lookup plus an n-gram table of past outputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from metagen.speculative.drafters import Draft, Drafter


@dataclass
class _NgramIndex:
    """Latest end position of every k-gram (k in [min_n, max_n]) of one row's tokens, and for
    each indexed occurrence the one before it (so all occurrences are found, latest first)."""

    min_n: int
    max_n: int
    tokens: list[int] = field(default_factory=list)
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)  # k-gram -> index after it
    earlier: dict[tuple[int, int], int] = field(default_factory=dict)  # (k, index after) -> the one before

    def extend(self, new: Sequence[int]) -> None:
        tokens, latest = self.tokens, self.latest
        for token in new:
            tokens.append(token)
            end = len(tokens)
            # index the k-grams ending one token earlier: their follower is now known
            for k in range(self.min_n, self.max_n + 1):
                if end - 1 - k >= 0:
                    gram = tuple(tokens[end - 1 - k : end - 1])
                    before = latest.get(gram)
                    if before is not None:
                        self.earlier[(k, end - 1)] = before
                    latest[gram] = end - 1

    def follower(self, suffix: Sequence[int]) -> int | None:
        """Position of the token after the latest earlier occurrence of `suffix`, if any."""
        return self.latest.get(tuple(suffix))

    def followers(self, suffix: Sequence[int], limit: int) -> list[int]:
        """Positions of the tokens after the latest `limit` earlier occurrences of `suffix`,
        latest first. O(limit)."""
        positions, position = [], self.latest.get(tuple(suffix))
        while position is not None and len(positions) < limit:
            positions.append(position)
            position = self.earlier.get((len(suffix), position))
        return positions


class NgramDrafter(Drafter):
    """Model-free drafting: prompt lookup plus an n-gram table of past outputs.

    For each row, the longest suffix (max_ngram down to min_ngram tokens) of the context that
    occurred earlier in the same context proposes the tokens that followed it (prompt lookup
    decoding, Saxena 2023); when the context has no match, a table of n-grams seen in earlier
    outputs of this drafter (kept across requests, as in ADED / token recycling) proposes the
    token that last followed the suffix. Proposals extend greedily, one lookup per token, to γ_b
    tokens or until no suffix matches. Drafts are point masses (deterministic).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, remember_outputs: bool = True,
                 memory_size: int = 200_000) -> None:
        for label, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("memory_size", memory_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label}={value!r} must be an int >= 1")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram={min_ngram} is larger than max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.remember_outputs = remember_outputs
        self.memory_size = memory_size
        self.memory: dict[tuple[int, ...], int] = {}  # k-gram of past outputs -> next token
        self._rows: list[_NgramIndex] = []

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        index = _NgramIndex(self.min_ngram, self.max_ngram)
        index.extend(prompt_ids)
        self._rows = [index] + [self._copy(index) for _ in range(batch_size - 1)]

    def select(self, rows: Sequence[int]) -> None:
        seen: set[int] = set()
        selected = []
        for r in rows:
            selected.append(self._rows[r] if r not in seen else self._copy(self._rows[r]))
            seen.add(r)
        self._rows = selected

    def propose(self, contexts, lengths, chain, generator) -> Draft:
        tokens = []
        for b, context in enumerate(contexts):
            index = self._rows[b]
            index.extend(context[len(index.tokens):])
            tokens.append(self._lookup(index, lengths[b]))
        return Draft.chain(tokens)

    def finish(self, outputs: Sequence[Sequence[int]]) -> None:
        if not self.remember_outputs:
            return
        for output in outputs:
            output = list(output)
            for end in range(1, len(output)):
                for k in range(self.min_ngram, self.max_ngram + 1):
                    if end - k >= 0:
                        self.memory[tuple(output[end - k : end])] = output[end]
        while len(self.memory) > self.memory_size:  # forget the oldest entries (dicts keep order)
            self.memory.pop(next(iter(self.memory)))

    def _lookup(self, index: _NgramIndex, count: int) -> list[int]:
        proposal: list[int] = []
        tokens = index.tokens
        while len(proposal) < count:
            context_tail = (tokens[-self.max_ngram:] + proposal)[-self.max_ngram:]
            follower = None
            for k in range(min(self.max_ngram, len(context_tail)), self.min_ngram - 1, -1):
                suffix = tuple(context_tail[-k:])
                position = index.follower(suffix)
                if position is not None:
                    # copy the run after the match (prompt lookup), then look up again
                    run = tokens[position : position + count - len(proposal)]
                    proposal.extend(run)
                    follower = run
                    break
                if suffix in self.memory:
                    follower = [self.memory[suffix]]
                    proposal.extend(follower)
                    break
            if not follower:
                break
        return proposal[:count]

    @staticmethod
    def _copy(index: _NgramIndex) -> _NgramIndex:
        return _NgramIndex(index.min_n, index.max_n, list(index.tokens), dict(index.latest), dict(index.earlier))
