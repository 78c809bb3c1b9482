"""`RowHistory`: what each row accepted, kept so that stateful processors can roll back
(private to `metagen.sampling`); `TokenHistoryState`: a processor whose state is each row's
tokens (n-gram blocking, momentum decoding).

The log of B rows is a `(B, capacity)` buffer with one column per `accept` call; a row skipped at
that call (negative token) gets `pad` there and is marked absent. The first `base` columns are
the state the log was created with (a prompt), which `rollback` never removes.

    accept:   O(B) (one column write; the buffer doubles when full, amortised O(B))
    rollback: O(B T) (rank the present entries of each row from the right)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ._tokens import PAD, PromptIds, left_aligned, prompt_matrix
from .processor import LogitsProcessor

MIN_CAPACITY = 16


class Removed(NamedTuple):
    """What a rollback took away: `mask (B, T)` of removed entries in `values (B, T)` (the log
    as it was before the rollback)."""

    mask: Tensor
    values: Tensor


class RowHistory:
    """Per-row log of accepted values (tokens, or a processor's state before each token).

    Attributes:
        accepted: `(B,)` long, entries accepted since creation (what rollback may remove).
        pad: the value stored where a row was skipped.
    """

    def __init__(self, initial: Tensor, pad: float, capacity: int = 0) -> None:
        rows, length = initial.shape
        capacity = max(capacity, length + 1, MIN_CAPACITY)
        self.pad = pad
        self._values = torch.full((rows, capacity), pad, dtype=initial.dtype, device=initial.device)
        self._values[:, :length] = initial
        self._present = torch.zeros(rows, capacity, dtype=torch.bool, device=initial.device)
        self._present[:, :length] = initial >= 0 if not initial.is_floating_point() else ~initial.isnan()
        self._length = length
        self.base = length
        self.accepted = torch.zeros(rows, dtype=torch.long, device=initial.device)

    @property
    def batch_size(self) -> int:
        return self._values.shape[0]

    @property
    def values(self) -> Tensor:
        """`(B, T)` view of the log (pad where a row was skipped)."""
        return self._values[:, : self._length]

    @property
    def present(self) -> Tensor:
        """`(B, T)` bool view: True where the row has an entry."""
        return self._present[:, : self._length]

    def has_holes(self) -> bool:
        """True when some row has a skipped column after an entry (one host sync)."""
        present = self.present
        return bool((present[:, :-1] & ~present[:, 1:]).any())

    def accept(self, values: Tensor, present: Tensor) -> None:
        """Append one column: `values (B,)` where `present (B,)` is True, pad elsewhere."""
        if self._length == self._values.shape[1]:
            self._values = torch.cat([self._values, torch.full_like(self._values, self.pad)], dim=1)
            self._present = torch.cat([self._present, torch.zeros_like(self._present)], dim=1)
        present = present.to(self._present.device)
        column = values.to(device=self._values.device, dtype=self._values.dtype)
        self._values[:, self._length] = torch.where(present, column, torch.full_like(column, self.pad))
        self._present[:, self._length] = present
        self.accepted += present.long()
        self._length += 1

    def rollback(self, counts: Tensor) -> Removed:
        """Remove the last `counts[b]` entries of row b (`counts (B,)` long, at most `accepted`).

        Trailing columns no row uses any more are dropped (never below `base`), so accepting k
        tokens and rolling back k leaves the log as it was."""
        counts = self._check_counts(counts)
        present = self.present
        values = self.values.clone()
        rank = present.flip(1).long().cumsum(1).flip(1)  # 1 for each row's last entry, 2 before it...
        removed = present & (rank <= counts[:, None])
        self._values[:, : self._length].masked_fill_(removed, self.pad)
        self._present[:, : self._length] &= ~removed
        self.accepted -= counts
        used = self.present.any(dim=0).nonzero()
        self._length = max(self.base, int(used[-1]) + 1 if used.numel() else 0)
        return Removed(removed, values)

    def _check_counts(self, counts: Tensor) -> Tensor:
        counts = counts.reshape(-1).to(device=self.accepted.device, dtype=torch.long)
        if counts.shape[0] != self.batch_size:
            raise ValueError(f"rollback counts has {counts.shape[0]} rows, the state has {self.batch_size}")
        bad = (counts < 0) | (counts > self.accepted)
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            raise ValueError(f"rollback of {int(counts[row])} tokens in row {row}, which accepted "
                             f"{int(self.accepted[row])}: must be in [0, {int(self.accepted[row])}]")
        return counts

    def select(self, indices: Tensor) -> None:
        """Row i becomes old row `indices[i]`, in place."""
        indices = indices.to(device=self._values.device, dtype=torch.long)
        self._values = self._values[indices]
        self._present = self._present[indices]
        self.accepted = self.accepted[indices]

    def fork(self, indices: Tensor) -> RowHistory:
        """An independent log made of rows `indices (B',)`."""
        forked = RowHistory.__new__(RowHistory)
        forked.pad, forked._length, forked.base = self.pad, self._length, self.base
        indices = indices.to(device=self._values.device, dtype=torch.long)
        forked._values = self._values[indices]
        forked._present = self._present[indices]
        forked.accepted = self.accepted[indices]
        return forked

    @staticmethod
    def concat(parts: Sequence[RowHistory]) -> RowHistory:
        """The rows of `parts` in one log; shorter logs are left-padded (absent entries), so each
        row's most recent entries stay at the right."""
        length = max(part._length for part in parts)
        joined = RowHistory.__new__(RowHistory)
        joined.pad, joined._length = parts[0].pad, length
        joined.base = max(length - part._length + part.base for part in parts)
        rows = sum(part.batch_size for part in parts)
        first = parts[0]._values
        joined._values = torch.full((rows, length + 1), joined.pad, dtype=first.dtype, device=first.device)
        joined._present = torch.zeros(rows, length + 1, dtype=torch.bool, device=first.device)
        start = 0
        for part in parts:
            end, shift = start + part.batch_size, length - part._length
            joined._values[start:end, shift:length] = part.values
            joined._present[start:end, shift:length] = part.present
            start = end
        joined.accepted = torch.cat([part.accepted for part in parts])
        return joined


class TokenHistoryState(LogitsProcessor):
    """A `LogitsProcessor` whose state is each row's tokens (prompt + accepted), kept in a
    `RowHistory`; subclasses say what `apply` does with `tokens()`.

    `accept` writes one column (O(B), amortised) and `rollback` blanks each row's last tokens, so
    the state after a rollback is the state that never accepted them. Rows may advance unevenly
    (speculative decoding appends a different number of tokens per row): a negative entry leaves
    a hole, and once there is one, `tokens()` joins each row's tokens up (`left_aligned`, O(B T)).
    select / fork / concat follow the KV cache; a fork or a join is a shallow copy of the
    subclass's settings with its own log.
    """

    def __init__(self, history: Tensor, capacity: int | None = None) -> None:
        self._log = RowHistory(left_aligned(history.long()), PAD, capacity or 0)  # (B, T)
        self._holes = False

    @staticmethod
    def prompt_rows(prompt_ids: PromptIds, batch_size: int, max_new_tokens: int,
                    device: torch.device | str | None) -> tuple[Tensor, int]:
        """The prompts as a left-padded `(B, T)` matrix and the room to reserve for generation."""
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        prompts = prompt_matrix(prompt_ids, batch_size, device)
        return prompts, prompts.shape[1] + max_new_tokens

    @property
    def batch_size(self) -> int:
        return self._log.batch_size

    @property
    def history(self) -> Tensor:
        """`(B, T)` view of the history so far (left-padded with -1)."""
        return self._log.values

    def tokens(self) -> Tensor:
        """`(B, T)` history with each row's tokens joined up at the right (a copy only when a row
        has holes)."""
        return left_aligned(self.history) if self._holes else self.history

    def accept(self, tokens: Tensor) -> None:
        """Append one token per row, `tokens (B,)`; negative entries are stored as padding."""
        column = tokens.reshape(-1).to(dtype=torch.long)
        present = column >= 0
        self._log.accept(column, present)
        self._holes = self._holes or not bool(present.all())

    def rollback(self, counts: Tensor) -> None:
        """Forget the last `counts[b]` generated tokens of row b. O(B T)."""
        self._log.rollback(counts)
        self._holes = self._log.has_holes()

    def reset(self) -> None:
        """Forget every generated token: the history is the prompt again."""
        self.rollback(self._log.accepted)

    def select(self, indices: Tensor) -> None:
        """Keep rows `indices (B',)` in that order, in place (follows a KV-cache reorder)."""
        self._log.select(indices)

    def fork(self, indices: Tensor) -> TokenHistoryState:
        """A new, independent state made of rows `indices (B',)`; this state is unchanged."""
        return self._with_log(self._log.fork(indices), self._holes)

    @classmethod
    def concat(cls, parts: Sequence[TokenHistoryState]) -> TokenHistoryState:
        """The rows of `parts` (same settings) in one state; shorter histories are left-padded."""
        log = RowHistory.concat([part._log for part in parts])
        return parts[0]._with_log(log, any(part._holes for part in parts) or log.has_holes())

    def _with_log(self, log: RowHistory, holes: bool) -> TokenHistoryState:
        state = copy.copy(self)
        state._log, state._holes = log, holes
        return state
