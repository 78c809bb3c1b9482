"""`SpanProcessor`: keeps each row's output a contiguous span of a passage (extractive QA).

The rule and its index are `metagen.structured.span` (a suffix automaton of the passage walked
with a trie of the vocabulary). Each of the B rows holds the automaton states it went through
(one per accepted token, for rollback) and a count of accepted end tokens. Per decoding step:

    mask = the cached bitmask row of each row's state   (B, ceil(V / 32)) int32, O(B · V / 32)
    out  = logits where allowed, -inf elsewhere          (`apply_token_bitmask`)
    after the token is chosen: accept(tokens) walks each row's state by its token's bytes

End tokens (the tokenizer's EOS ids plus `stop_token_ids`) are allowed only after a non-empty
span that ends on a character boundary (`allows_stop`), or where no text token can follow (a dead
end, which `finished` reports; the row ends unaccepted unless the span may end there). After an
end token the row allows only end tokens. Greedy decoding with it outputs the passage's span the
model ranks highest token by token, never text from elsewhere.

    from metagen.decoding import generate
    from metagen.sampling.span import SpanProcessor
    from metagen.structured import span_of
    processor = SpanProcessor(span_of(passage), model.tokenizer)
    answer = generate(model, question, SamplingParams(temperature=0), processors=[processor])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from metagen.sampling.processor import LogitsProcessor
from metagen.structured.bitmask import apply_token_bitmask
from metagen.structured.span import Span, SpanIndex, span_of

if TYPE_CHECKING:
    from metagen.models.tokenizer import Tokenizer


def span_index(span: Span, tokenizer: Tokenizer, stop_token_ids: Sequence[int] = ()) -> SpanIndex:
    """The `SpanIndex` of `span` over the tokenizer's vocabulary (each token's bytes as the
    structured engine reads them; control tokens never allowed as text)."""
    from metagen.structured.engine import token_bytes

    ends = set(tokenizer.eos_token_ids) | {int(token) for token in stop_token_ids}
    return SpanIndex(span.passage, token_bytes(tokenizer), ends)


class SpanProcessor(LogitsProcessor):
    """Per-row span state for B rows (see the module).

    Args:
        span: the constraint (`metagen.structured.span_of(passage)`, or the passage's text), or
            a built `SpanIndex` (then `tokenizer` may be None: the index holds the vocabulary and
            end ids).
        tokenizer: the model's tokenizer.
        batch_size: B, the number of rows.
        stop_token_ids: more ids that end a row, allowed where EOS is.
    """

    argmax_invariant = False

    def __init__(self, span: Span | str | SpanIndex, tokenizer: Tokenizer | None = None, batch_size: int = 1, *,
                 stop_token_ids: Sequence[int] = ()) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if isinstance(span, SpanIndex):
            self.index = span
        elif tokenizer is None:
            raise ValueError("a SpanProcessor built from a Span needs the model's tokenizer")
        else:
            self.index = span_index(span if isinstance(span, Span) else span_of(span), tokenizer, stop_token_ids)
        self.name = "span"
        self._end_ids = frozenset(self.index.end_ids)
        self._states = [[0] for _ in range(batch_size)]  # per row: the states after 0, 1, ... tokens
        self._ended = [0] * batch_size

    @property
    def batch_size(self) -> int:
        return len(self._states)

    def state(self, row: int) -> int:
        """The automaton state of row `row` (0: nothing accepted yet)."""
        return self._states[row][-1]

    def fill_bitmask(self) -> Tensor:
        """The allowed tokens of every row, (B, ceil(V / 32)) int32."""
        rows = [self.index.end_row if ended else self.index.row(states[-1])
                for states, ended in zip(self._states, self._ended)]
        return torch.from_numpy(np.stack(rows).view(np.int32))

    def apply(self, logits: Tensor) -> Tensor:
        """New logits (B, V) float32: -inf for every token that would leave the passage."""
        if logits.dim() != 2 or logits.shape[0] != self.batch_size:
            raise ValueError(f"logits must be (B, V) with B = {self.batch_size}, got {tuple(logits.shape)}")
        return apply_token_bitmask(logits, self.fill_bitmask())

    def accept(self, tokens: Tensor) -> None:
        """Advance each row by its token (B,) long; a negative token skips the row. ValueError for
        a token the row's mask forbids (the row is left unchanged)."""
        listed = _row_list(tokens, self.batch_size, "tokens")
        for row, token in enumerate(listed):
            if token < 0:
                continue
            if token in self._end_ids:
                if not (self._ended[row] or self.allows_stop(row) or self.finished(row)):
                    raise ValueError(f"row {row}: end token {token} before a non-empty span of the passage")
                self._ended[row] += 1
                continue
            following = None if self._ended[row] else self.index.step(self.state(row), token)
            if following is None:
                raise ValueError(f"row {row}: token {token} would leave the passage (or follows the end)")
            self._states[row].append(following)

    def rollback(self, counts: Tensor) -> None:
        """Forget the last counts[b] (B,) accepted tokens of row b (end tokens first)."""
        for row, count in enumerate(_row_list(counts, self.batch_size, "counts")):
            held = len(self._states[row]) - 1 + self._ended[row]
            if not 0 <= count <= held:
                raise ValueError(f"rollback of {count} tokens in row {row}, which accepted {held}")
            undo_end = min(count, self._ended[row])
            self._ended[row] -= undo_end
            if count > undo_end:
                del self._states[row][len(self._states[row]) - (count - undo_end):]

    def select(self, indices: Tensor) -> None:
        """Rows become old rows indices[i] (B',); repeated rows are copied."""
        order = _indices(indices, self.batch_size)
        self._states = [list(self._states[index]) for index in order]
        self._ended = [self._ended[index] for index in order]

    def fork(self, indices: Tensor) -> SpanProcessor:
        """A new, independent processor holding copies of rows indices (B',); the index is shared
        (it only caches)."""
        clone = object.__new__(SpanProcessor)
        clone.__dict__.update(self.__dict__)
        clone.select(indices)  # copies the rows' lists: this processor is unchanged
        return clone

    @classmethod
    def concat(cls, parts: Sequence[LogitsProcessor]) -> SpanProcessor:
        """One processor with copies of the rows of `parts` (SpanProcessors of one index)."""
        if not parts:
            raise ValueError("concat needs at least one processor")
        first = parts[0]
        if any(not isinstance(part, SpanProcessor) or part.index is not first.index for part in parts):
            raise ValueError("concat joins SpanProcessors of one passage index only")
        clone = object.__new__(SpanProcessor)
        clone.__dict__.update(first.__dict__)
        clone._states = [list(states) for part in parts for states in part._states]
        clone._ended = [count for part in parts for count in part._ended]
        return clone

    def reset(self) -> None:
        self._states = [[0] for _ in self._states]
        self._ended = [0] * self.batch_size

    def allows_stop(self, row: int) -> bool:
        """The row holds a non-empty span ending on a character boundary (or has ended so)."""
        return self.index.may_end(self.state(row))

    def finished(self, row: int) -> bool:
        """The row ended, or no text token can extend its span."""
        return self._ended[row] > 0 or not len(self.index.allowed(self.state(row)))


def _row_list(values, batch_size: int, name: str) -> list[int]:
    listed = values.tolist() if isinstance(values, Tensor) else list(values)
    if len(listed) != batch_size:
        raise ValueError(f"{name} must have one entry per row ({batch_size}), got {len(listed)}")
    return [int(value) for value in listed]


def _indices(indices, batch_size: int) -> list[int]:
    order = indices.tolist() if isinstance(indices, Tensor) else [int(index) for index in indices]
    if not order:
        raise ValueError("select / fork need at least one row index")
    for index in order:
        if not 0 <= index < batch_size:
            raise ValueError(f"row index {index} is out of range for {batch_size} rows")
    return order
