"""Exact extraction: outputs that are a contiguous span of a given passage (extractive QA).

    span_of(passage)  ->  Span                  the constraint, a frozen value
    SpanIndex(passage, vocabulary, end_ids)     which tokens keep the text a substring

The rule, per decoding step: with the text y decoded so far (its UTF-8 bytes), token v of bytes
b(v) is allowed iff y · b(v) is a substring of the passage's bytes; an end token is allowed iff y
is non-empty and ends on a character boundary. Token boundaries play no part: any tokenization of
any span is reachable, and no token leaves the passage.

A regular expression or grammar listing every span has O(n²) alternatives for a passage of n
bytes; here the passage's suffix automaton (Blumer et al. 1985) recognises every substring with
at most 2n − 1 states, built in O(n) time. The decoding state is one automaton state: the text y
reaches state s iff y is a substring, and s determines what may follow. The allowed tokens of a
state are found by walking a trie of the vocabulary's byte strings (only the tokens that occur in
the passage, ~1 ms to find for V = 49152) in step with the automaton, cut wherever the automaton
has no edge: time O(visited trie nodes) <= O(min(trie size, n · L)), L the longest token in bytes,
once per state (cached as a bitmask row of ceil(V / 32) words). A decoding step costs a cache
lookup and one O(|b(v)|) walk to accept the chosen token.

Characters: the text starts at a character boundary (no first token may start with a UTF-8
continuation byte 10xxxxxx), so it decodes as the passage does; it may end only at a boundary.
All strings of one automaton state share their end positions, so "the byte after this text in
the passage is not a continuation byte" is a property of the state (`boundary`), read from its
first end position.

The processor that applies it while decoding is `metagen.sampling.span.SpanProcessor`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_CONTINUATION = 0b1000_0000  # a UTF-8 continuation byte is 10xxxxxx


def _is_continuation(byte: int) -> bool:
    return byte & 0b1100_0000 == _CONTINUATION


@dataclass(frozen=True)
class Span:
    """The constraint "the output is a non-empty contiguous substring of `passage`"."""

    passage: str

    def __post_init__(self) -> None:
        if not isinstance(self.passage, str) or not self.passage:
            raise ValueError(f"passage={self.passage!r} is out of range: must be a non-empty str")


def span_of(passage: str) -> Span:
    """The span constraint over `passage` (ValueError for an empty one)."""
    return Span(passage)


class SuffixAutomaton:
    """The minimal automaton of every substring of `data` (bytes); state 0 is the empty string.

    edges[s]: byte -> next state; link[s]: suffix link; length[s]: the longest string of s;
    first_end[s]: the end index (inclusive) of the first occurrence of s's strings.
    States <= 2n − 1 for n >= 2 bytes; construction O(n) amortised (Blumer et al. 1985)."""

    def __init__(self, data: bytes) -> None:
        self.edges: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.first_end = [-1]
        last = 0
        for index, byte in enumerate(data):
            last = self._extend(last, byte, index)

    def _new(self, length: int, first_end: int, edges: dict[int, int], link: int) -> int:
        self.edges.append(edges)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.edges) - 1

    def _extend(self, last: int, byte: int, index: int) -> int:
        current = self._new(self.length[last] + 1, index, {}, -1)
        state = last
        while state != -1 and byte not in self.edges[state]:
            self.edges[state][byte] = current
            state = self.link[state]
        if state == -1:
            self.link[current] = 0
            return current
        target = self.edges[state][byte]
        if self.length[state] + 1 == self.length[target]:
            self.link[current] = target
            return current
        clone = self._new(self.length[state] + 1, self.first_end[target], dict(self.edges[target]),
                          self.link[target])
        while state != -1 and self.edges[state].get(byte) == target:
            self.edges[state][byte] = clone
            state = self.link[state]
        self.link[target] = self.link[current] = clone
        return current

    def walk(self, state: int, data: bytes) -> int | None:
        """The state after reading `data` from `state`, or None when it leaves the substrings."""
        for byte in data:
            state = self.edges[state].get(byte)
            if state is None:
                return None
        return state


class SpanIndex:
    """Which tokens keep the decoded text a substring of the passage (see the module).

    vocabulary[v]: token v's bytes, None for a control token (never allowed as text); end_ids: the
    tokens that end the output. Masks are int32 bitmask rows over len(vocabulary) tokens, the
    layout of `metagen.structured.bitmask`."""

    def __init__(self, passage: str, vocabulary: Sequence[bytes | None], end_ids: Iterable[int]) -> None:
        self.span = span_of(passage)
        data = passage.encode("utf-8")
        self.data = data
        self.automaton = SuffixAutomaton(data)
        self.vocabulary = vocabulary
        self.vocab_size = len(vocabulary)
        self.end_ids = sorted(set(int(token) for token in end_ids))
        for token in self.end_ids:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"end token {token} is out of range for a vocabulary of {self.vocab_size} tokens")
        if not self.end_ids:
            raise ValueError("a span constraint needs at least one end token id")
        # the trie of the tokens that occur in the passage: children[node] byte -> node; ends[node] ids
        self._children: list[dict[int, int]] = [{}]
        self._ends: list[list[int]] = [[]]
        for token, piece in enumerate(vocabulary):
            if piece and token not in self.end_ids and piece in data:
                self._insert(piece, token)
        self.words = (self.vocab_size + 31) // 32
        self.end_row = self._bits(self.end_ids)
        self._allowed: dict[int, np.ndarray] = {}  # state -> sorted ids (int64)
        self._rows: dict[int, np.ndarray] = {}  # state -> (W,) uint32 row, end tokens excluded

    def _insert(self, piece: bytes, token: int) -> None:
        node = 0
        for byte in piece:
            child = self._children[node].get(byte)
            if child is None:
                child = len(self._children)
                self._children[node][byte] = child
                self._children.append({})
                self._ends.append([])
            node = child
        self._ends[node].append(token)

    def step(self, state: int, token: int) -> int | None:
        """The state after token `token` from `state`; None when the token is not allowed there."""
        piece = self.vocabulary[token] if 0 <= token < self.vocab_size else None
        if not piece or token in self.end_ids or (state == 0 and _is_continuation(piece[0])):
            return None
        return self.automaton.walk(state, piece)

    def allowed(self, state: int) -> np.ndarray:
        """The ids (sorted, int64) of the text tokens allowed after `state`, end tokens excluded.
        Trie and automaton walked together, O(visited trie nodes); cached per state."""
        found = self._allowed.get(state)
        if found is not None:
            return found
        ids: list[int] = []
        edges = self.automaton.edges
        stack = [(child, edges[state][byte]) for byte, child in self._children[0].items()
                 if byte in edges[state] and not (state == 0 and _is_continuation(byte))]
        while stack:
            node, at = stack.pop()
            ids += self._ends[node]
            stack += [(child, edges[at][byte]) for byte, child in self._children[node].items() if byte in edges[at]]
        found = self._allowed[state] = np.array(sorted(ids), dtype=np.int64)
        return found

    def may_end(self, state: int) -> bool:
        """The text of `state` is non-empty and ends on a character boundary."""
        if state == 0:
            return False
        after = self.automaton.first_end[state] + 1
        return after == len(self.data) or not _is_continuation(self.data[after])

    def row(self, state: int) -> np.ndarray:
        """The bitmask row (W,) uint32 of the tokens allowed after `state`: its text tokens, plus
        the end tokens where the text may end or where nothing else can follow (a dead end, which
        ends the output unaccepted). Cached per state; do not modify."""
        row = self._rows.get(state)
        if row is None:
            row = self._rows[state] = self._bits(self.allowed(state))
        if self.may_end(state) or not len(self.allowed(state)):
            return row | self.end_row
        return row

    def _bits(self, ids) -> np.ndarray:
        row = np.zeros(self.words, dtype=np.uint32)
        ids = np.asarray(ids, dtype=np.int64)
        np.bitwise_or.at(row, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
        return row
