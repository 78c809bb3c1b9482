"""`StructuredProcessor`: a stateful logits processor that keeps each row inside a constraint.

Each of the B rows owns an llguidance matcher (a deep copy of the spec's compiled matcher), so
rows of one batch (n samples, beams, tree nodes) advance, fork and roll back independently. Per
decoding step:

    mask  = matchers' allowed sets, (B, ceil(V / 32)) int32 bits   (llguidance, native threads)
    out   = logits where allowed, -inf elsewhere                    (fused C++ kernel)
    after the token is chosen: accept(tokens) advances every row's matcher

End tokens (the tokenizer's EOS ids, plus `stop_token_ids`) are allowed only where the row's
constraint accepts. They are never fed to the matcher: an accepted end token is counted in
`ended[b]`, after which the row's mask allows only end tokens, so a row that keeps being asked
for masks after it ended (or after the matcher stopped: nothing can follow) gets EOS and never an
exception. A row whose matcher failed inside llguidance (a resource limit) also gets only EOS, but
`allows_stop` is False and `error(row)` says why: it must end as incomplete, not as valid output.

State per row: the matcher, `consumed[b]` tokens it holds (for rollback bounds) and `ended[b]`.
accept / rollback / select / fork / reset follow the cache: rollback(k) forgets the last k
accepted tokens (end tokens first), select(indices) reorders rows and deep-copies repeated ones
(fork), reset() returns every row to the state right after the prompt.

Costs (SmolLM2, V = 49152, 2 cores): mask ~30-200 us per row, kernel ~7 us per row, accept,
rollback and fork a few microseconds per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from metagen.sampling.processor import LogitsProcessor
from metagen.structured.bitmask import apply_token_bitmask, words_for
from metagen.structured.compile import compiled_matcher
from metagen.structured.engine import executor
from metagen.structured.spec import StructuredOutputs

if TYPE_CHECKING:
    from metagen.models.tokenizer import Tokenizer


class StructuredProcessor(LogitsProcessor):
    """Per-row constraint state for B rows (see the module docstring).

    Args:
        spec: the constraint.
        tokenizer: the model's tokenizer (its EOS ids end an accepted output).
        batch_size: B, the number of rows.
        stop_token_ids: more ids that end a row; allowed, like EOS, only where the constraint accepts.
        prefix: text the output must start with before the constrained text (token healing's
            removed prompt text); "" for none.
    """

    argmax_invariant = False

    def __init__(self, spec: StructuredOutputs, tokenizer: Tokenizer, batch_size: int = 1, *,
                 stop_token_ids: Sequence[int] = (), prefix: str = "") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        template = compiled_matcher(spec, tokenizer, prefix)
        self.name = f"structured:{spec.kind}"
        self.spec = spec
        self._tokenizer = tokenizer
        self._end_ids = frozenset(tokenizer.eos_token_ids) | frozenset(int(t) for t in stop_token_ids)
        extra_stop_ids = sorted(self._end_ids - frozenset(tokenizer.eos_token_ids))
        self._extra_stop_ids = [(token_id // 32, np.uint32(1 << (token_id % 32))) for token_id in extra_stop_ids]
        self._end_words, self._end_bits = _word_bits(sorted(self._end_ids))
        self._words = words_for(tokenizer.vocab_size)
        self._matchers = [template.deep_copy() for _ in range(batch_size)]
        self._consumed = [0] * batch_size
        self._ended = [0] * batch_size

    # -- the interface ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return len(self._matchers)

    def fill_bitmask(self) -> Tensor:
        """The allowed tokens of every row as a bitmask (B, ceil(V_tokenizer / 32)) int32."""
        mask = torch.zeros(self.batch_size, self._words, dtype=torch.int32)
        live = [(matcher, row) for row, matcher in enumerate(self._matchers) if self._ended[row] == 0]
        if live:
            executor().unsafe_compute_mask_ptr(live, mask.data_ptr(), self._words * 4, self.batch_size)
        words = mask.numpy().view(np.uint32)  # (B, W), shares memory; numpy: no torch dispatch per row
        for row, matcher in enumerate(self._matchers):
            if self._ended[row]:
                words[row, self._end_words] = self._end_bits  # only end tokens after the end
            elif self._extra_stop_ids:
                accepting = matcher.is_accepting() and not matcher.is_error()
                for word, bit in self._extra_stop_ids:
                    words[row, word] = words[row, word] | bit if accepting else words[row, word] & ~bit
        return mask

    def apply(self, logits: Tensor) -> Tensor:
        """New logits (B, V) float32: -inf for the tokens the rows' constraints forbid."""
        if logits.dim() != 2 or logits.shape[0] != self.batch_size:
            raise ValueError(f"logits must be (B, V) with B = {self.batch_size}, got {tuple(logits.shape)}")
        return apply_token_bitmask(logits, self.fill_bitmask())

    def accept(self, tokens: Tensor) -> None:
        """Advance each row by its token (B,) long; a negative token skips the row.

        Raises ValueError for a token the row's mask forbids (the row's state is left unchanged).
        """
        for row, token in enumerate(_row_list(tokens, self.batch_size, "tokens")):
            if token >= 0:
                self._accept_one(row, token)

    def rollback(self, counts: Tensor) -> None:
        """Forget the last counts[b] (B,) accepted tokens of each row b."""
        for row, count in enumerate(_row_list(counts, self.batch_size, "counts")):
            if count < 0 or count > self._consumed[row] + self._ended[row]:
                raise ValueError(f"rollback of {count} tokens in row {row}, which accepted "
                                 f"{self._consumed[row] + self._ended[row]}")
            undo_end = min(count, self._ended[row])
            self._ended[row] -= undo_end
            if count > undo_end:
                if not self._matchers[row].rollback(count - undo_end):
                    raise ValueError(f"row {row}: the matcher cannot roll back {count - undo_end} tokens "
                                     f"({self.error(row)})")
                self._consumed[row] -= count - undo_end

    def select(self, indices: Tensor) -> None:
        """Rows become old rows indices[i] (B',); an old row taken twice is deep-copied (a fork)."""
        order = _indices(indices, self.batch_size)
        taken: set[int] = set()
        matchers = []
        for index in order:
            matchers.append(self._matchers[index].deep_copy() if index in taken else self._matchers[index])
            taken.add(index)
        self._matchers = matchers
        self._consumed = [self._consumed[index] for index in order]
        self._ended = [self._ended[index] for index in order]

    def fork(self, indices: Tensor) -> StructuredProcessor:
        """A new, independent processor holding copies of rows indices (B',)."""
        order = _indices(indices, self.batch_size)
        clone = object.__new__(StructuredProcessor)
        clone.__dict__.update(self.__dict__)
        clone._matchers = [self._matchers[index].deep_copy() for index in order]
        clone._consumed = [self._consumed[index] for index in order]
        clone._ended = [self._ended[index] for index in order]
        return clone

    @classmethod
    def concat(cls, parts: Sequence[LogitsProcessor]) -> StructuredProcessor:
        """One processor whose rows are copies of the rows of `parts`, in order (each part is a
        StructuredProcessor of the same constraint; parts are unchanged)."""
        if not parts:
            raise ValueError("concat needs at least one processor")
        first = parts[0]
        for part in parts:
            if not isinstance(part, StructuredProcessor) or part.spec != first.spec or part._end_ids != first._end_ids:
                raise ValueError("concat joins StructuredProcessors of one constraint only")
        clone = object.__new__(StructuredProcessor)
        clone.__dict__.update(first.__dict__)
        clone._matchers = [matcher.deep_copy() for part in parts for matcher in part._matchers]
        clone._consumed = [count for part in parts for count in part._consumed]
        clone._ended = [count for part in parts for count in part._ended]
        return clone

    def reset(self) -> None:
        """Every row back to the state right after the prompt."""
        for matcher in self._matchers:
            matcher.reset()
        self._consumed = [0] * self.batch_size
        self._ended = [0] * self.batch_size

    def allows_stop(self, row: int) -> bool:
        """True where EOS / a stop token may end the row: the constraint accepts what it holds."""
        matcher = self._matchers[row]
        return not matcher.is_error() and (self._ended[row] > 0 or matcher.is_accepting())

    def forced(self, row: int) -> list[int]:
        """Tokens that are the only possible continuation of the row (jump-forward); [] if none."""
        matcher = self._matchers[row]
        if self._ended[row] or matcher.is_stopped():
            return []
        return list(matcher.compute_ff_tokens())

    def finished(self, row: int) -> bool:
        """True when only an end token can follow (the row ended, or the matcher stopped)."""
        return self._ended[row] > 0 or self._matchers[row].is_stopped()

    def error(self, row: int) -> str:
        """Why the row's matcher failed (a resource limit inside llguidance), or "" when it did not."""
        return self._matchers[row].get_error().replace("<non-verbose/>", "").strip()

    # -- helpers ---------------------------------------------------------------------------------

    def _accept_one(self, row: int, token: int) -> None:
        matcher = self._matchers[row]
        if token in self._end_ids:  # a failed matcher's row may end too (its mask allows only EOS)
            if not (self.allows_stop(row) or matcher.is_error()):
                raise ValueError(f"row {row}: end token {token} where the constraint is not complete")
            self._ended[row] += 1
            return
        if self._ended[row] or matcher.is_stopped():
            raise ValueError(f"row {row}: token {token} after the constraint ended; only end tokens "
                             f"{sorted(self._end_ids)} may follow")
        if matcher.try_consume_tokens([token]) != 1:
            raise ValueError(f"row {row}: token {token} ({self._tokenizer.decode([token])!r}) is not allowed "
                             "by the constraint here")
        self._consumed[row] += 1


def _word_bits(token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For a set of ids: the words they live in (K,) and those words with only their bits set (K,) uint32."""
    words: dict[int, int] = {}
    for token_id in token_ids:
        words[token_id // 32] = words.get(token_id // 32, 0) | (1 << (token_id % 32))
    return np.array(list(words), dtype=np.int64), np.array(list(words.values()), dtype=np.uint32)


def _row_list(values: Any, batch_size: int, name: str) -> list[int]:
    listed = values.tolist() if isinstance(values, Tensor) else list(values)
    if len(listed) != batch_size:
        raise ValueError(f"{name} must have one entry per row ({batch_size}), got {len(listed)}")
    return [int(value) for value in listed]


def _indices(indices: Any, batch_size: int) -> list[int]:
    order = indices.tolist() if isinstance(indices, Tensor) else [int(index) for index in indices]
    for index in order:
        if not 0 <= index < batch_size:
            raise ValueError(f"row index {index} is out of range for {batch_size} rows")
    if not order:
        raise ValueError("select / fork need at least one row index")
    return order
