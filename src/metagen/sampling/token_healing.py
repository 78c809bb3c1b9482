"""`TokenHealingProcessor`: the first generated tokens of B rows reproduce the prompt text token
healing removed (`metagen.structured.healing`: `heal_prompt` and the rule). Per step, the mask is
a range lookup in the vocabulary sorted by bytes plus a dictionary lookup per prefix of the
remaining text: O(|r| + log V) per row, then one pass to write the bitmask."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from metagen.sampling.processor import LogitsProcessor
from metagen.structured.bitmask import apply_token_bitmask, bool_to_bitmask
from metagen.structured.healing import vocabulary

if TYPE_CHECKING:
    from metagen.models.tokenizer import Tokenizer


class TokenHealingProcessor(LogitsProcessor):
    """B rows whose first generated tokens must reproduce `removed_text` (see the module docstring)."""

    argmax_invariant = False

    def __init__(self, tokenizer: Tokenizer, removed_text: str, batch_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.name = "token_healing"
        self.removed_text = removed_text
        self._target = removed_text.encode("utf-8")
        self._vocab = vocabulary(tokenizer)
        self._history: list[list[int]] = [[] for _ in range(batch_size)]  # bytes of r covered after each token

    @property
    def batch_size(self) -> int:
        return len(self._history)

    def _covered(self, row: int) -> int:
        history = self._history[row]
        return history[-1] if history else 0

    def allowed(self, row: int) -> Tensor | None:
        """Ids the row may take next (K,), or None when the row is free."""
        remaining = self._target[self._covered(row):]
        if not remaining:
            return None
        prefixes = torch.tensor(self._vocab.proper_prefixes(remaining), dtype=torch.long)
        return torch.cat([self._vocab.starting_with(remaining), prefixes])

    def fill_bitmask(self) -> Tensor:
        """The allowed tokens of every row as a bitmask (B, ceil(V / 32)) int32 (free rows: all ones)."""
        keep = np.ones((self.batch_size, self._vocab.size), dtype=bool)  # numpy: no torch dispatch per row
        for row in range(self.batch_size):
            ids = self.allowed(row)
            if ids is not None:
                keep[row] = False
                keep[row, ids.numpy()] = True
        return bool_to_bitmask(torch.from_numpy(keep))

    def apply(self, logits: Tensor) -> Tensor:
        """New logits (B, V) float32; rows still reproducing r keep only the allowed tokens."""
        if logits.dim() != 2 or logits.shape[0] != self.batch_size:
            raise ValueError(f"logits must be (B, V) with B = {self.batch_size}, got {tuple(logits.shape)}")
        if all(self.allows_stop(row) for row in range(self.batch_size)):  # every row reproduced r
            return logits.float().clone()
        mask = self.fill_bitmask()
        if logits.shape[1] > 32 * mask.shape[1]:  # ids past the tokenizer's vocabulary: free where the row is
            free = torch.tensor([self.allows_stop(row) for row in range(self.batch_size)])
            out = apply_token_bitmask(logits, mask)
            return torch.where(free.unsqueeze(1), logits.float(), out)
        return apply_token_bitmask(logits, mask)

    def accept(self, tokens: Tensor) -> None:
        """Advance each row by its token (B,) long (negative: skipped); ValueError for a forbidden one."""
        listed = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
        if len(listed) != self.batch_size:
            raise ValueError(f"tokens must have one entry per row ({self.batch_size}), got {len(listed)}")
        for row, token in enumerate(int(token) for token in listed):
            if token >= 0:
                self._history[row].append(self._advance(row, token))

    def _advance(self, row: int, token: int) -> int:
        covered = self._covered(row)
        remaining = self._target[covered:]
        if not remaining:
            return covered
        data = self._vocab.table[token] if 0 <= token < self._vocab.size else None
        if data and data.startswith(remaining):
            return len(self._target)
        if data and remaining.startswith(data):
            return covered + len(data)
        raise ValueError(f"row {row}: token {token} ({data!r}) does not continue the healed prompt text "
                         f"{self.removed_text!r} (remaining {remaining!r})")

    def rollback(self, counts: Tensor) -> None:
        """Forget the last counts[b] accepted tokens of row b."""
        for row, count in enumerate(int(count) for count in (counts.tolist() if isinstance(counts, Tensor) else counts)):
            if count < 0 or count > len(self._history[row]):
                raise ValueError(f"rollback of {count} tokens in row {row}, which accepted {len(self._history[row])}")
            del self._history[row][len(self._history[row]) - count:]

    def select(self, indices: Tensor) -> None:
        """Rows become old rows indices[i]; repeats are copies (a fork)."""
        self._history = [list(self._history[index]) for index in _order(indices, self.batch_size)]

    def fork(self, indices: Tensor) -> TokenHealingProcessor:
        clone = object.__new__(TokenHealingProcessor)
        clone.__dict__.update(self.__dict__)
        clone._history = [list(self._history[index]) for index in _order(indices, self.batch_size)]
        return clone

    @classmethod
    def concat(cls, parts) -> TokenHealingProcessor:
        """One processor whose rows are copies of the rows of `parts` (same removed text), in order."""
        first = parts[0]
        if any(not isinstance(part, TokenHealingProcessor) or part.removed_text != first.removed_text for part in parts):
            raise ValueError("concat joins TokenHealingProcessors of one removed text only")
        clone = object.__new__(TokenHealingProcessor)
        clone.__dict__.update(first.__dict__)
        clone._history = [list(history) for part in parts for history in part._history]
        return clone

    def reset(self) -> None:
        self._history = [[] for _ in range(self.batch_size)]

    def allows_stop(self, row: int) -> bool:
        """EOS only once the removed text is reproduced."""
        return self._covered(row) == len(self._target)

    def forced(self, row: int) -> list[int]:
        """The single allowed token while r is incomplete, if there is exactly one; else []."""
        ids = self.allowed(row)
        return [int(ids[0])] if ids is not None and ids.numel() == 1 else []

    def finished(self, row: int) -> bool:
        return False  # healing never ends a row


def _order(indices: Tensor, batch_size: int) -> list[int]:
    order = indices.tolist() if isinstance(indices, Tensor) else [int(index) for index in indices]
    if not order or any(not 0 <= index < batch_size for index in order):
        raise ValueError(f"row indices {order} must be non-empty and in [0, {batch_size})")
    return order
