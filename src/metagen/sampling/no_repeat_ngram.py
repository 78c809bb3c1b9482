"""No-repeat n-gram blocking (Paulus et al., 2018; the `no_repeat_ngram_size` of Hugging Face).

Ban every token that would complete an n-gram already present in the history x_1..x_T:

    banned = { x_{i+n-1} : (x_i, ..., x_{i+n-2}) = (x_{T-n+2}, ..., x_T),  1 <= i <= T-n+1 }

For n = 1 every token of the history is banned. The match is computed with tensors, with no
Python loop over positions: slide a window of width n over the history, compare the first n-1
tokens of every window with the last n-1 tokens, and scatter the n-th token of each matching
window into a ban mask. Windows that contain padding (negative ids) never match.

`NoRepeatNgramState` keeps a preallocated history buffer so that a decoding step only writes one
column; the ban itself is recomputed from the buffer at each step, so rolling tokens back is
blanking them in the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._common import float_logits, keep_only
from ._history import RowHistory
from ._tokens import (
    PAD,
    PromptIds,
    TokenIds,
    history_for,
    left_aligned,
    prompt_matrix,
    rows_of,
)
from .processor import LogitsProcessor


def banned_tokens(history: Tensor, n: int, vocab_size: int) -> Tensor:
    """Tokens that would repeat an n-gram: `history (N, T)` left-padded -> `(N, V)` bool.

    Time complexity: O(T n + V) per row.
    """
    rows, length = history.shape
    banned = torch.zeros(rows, vocab_size, dtype=torch.int32, device=history.device)
    if length < n:
        return banned.bool()
    windows = history.unfold(-1, n, 1)  # (N, W, n), W = T - n + 1
    suffix = history[:, length - (n - 1):]  # (N, n-1) the last n-1 tokens
    matches = (windows[..., : n - 1] == suffix[:, None, :]).all(dim=-1)  # (N, W)
    matches &= (windows >= 0).all(dim=-1) & (suffix >= 0).all(dim=-1, keepdim=True)
    completions = windows[..., n - 1].clamp(min=0)  # (N, W) token that followed each window
    banned.scatter_add_(1, completions, matches.int())  # add, not assign: duplicate ids
    return banned > 0


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is out of range: n-gram size must be an int >= 1")
    return n


def no_repeat_ngram(logits: Tensor, token_ids: TokenIds, n: int) -> Tensor:
    """Set to `-inf` every token that would complete an n-gram already in `token_ids`.

    Args:
        logits: `(..., V)` scores.
        token_ids: `(..., T)` history (prompt + generation) matching logits' batch dims; negative
            entries are padding and are skipped (the tokens around them are joined up). A list
            of ints is accepted for 1-D logits.
        n: n-gram size >= 1.

    Returns:
        New float32 logits `(..., V)`; the input is not modified.

    Time complexity: O(T n + V) per row.
    """
    n = _check_n(n)
    logits = float_logits(logits)
    history = history_for(token_ids, logits)
    flat = left_aligned(rows_of(history))  # (N, T)
    banned = banned_tokens(flat, n, logits.shape[-1]).reshape(logits.shape)
    return keep_only(logits, ~banned)


class NoRepeatNgramState(LogitsProcessor):
    """History of B rows (prompt + generated tokens) for n-gram blocking (a `LogitsProcessor`).

    The history is a `RowHistory`: `accept` writes one column (O(B), amortised) and `rollback`
    blanks each row's last tokens. Rows may advance unevenly (speculative decoding appends a
    different number of tokens per row): a negative entry leaves a hole, and once there is one,
    `apply` joins each row's tokens up (`left_aligned`, O(B·T)) before matching.
    """

    name = "no_repeat_ngram"
    argmax_invariant = False

    def __init__(self, n: int, history: Tensor, capacity: int | None = None) -> None:
        self.n = _check_n(n)
        self._log = RowHistory(left_aligned(history.long()), PAD, capacity or 0)  # (B, T)
        self._holes = False

    @classmethod
    def from_prompt(
        cls,
        n: int,
        prompt_ids: PromptIds,
        batch_size: int,
        max_new_tokens: int = 0,
        device: torch.device | str | None = None,
    ) -> NoRepeatNgramState:
        """State after the prompt; room is reserved for `max_new_tokens` generated tokens."""
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        prompts = prompt_matrix(prompt_ids, batch_size, device)
        return cls(n, prompts, capacity=prompts.shape[1] + max_new_tokens)

    @property
    def batch_size(self) -> int:
        return self._log.batch_size

    @property
    def history(self) -> Tensor:
        """`(B, T)` view of the history so far (left-padded with -1)."""
        return self._log.values

    def apply(self, logits: Tensor) -> Tensor:
        """Ban n-gram repeats in `logits (B, V)`; returns new float32 logits. O(B (T n + V))."""
        logits = float_logits(logits)
        history = left_aligned(self.history) if self._holes else self.history
        return keep_only(logits, ~banned_tokens(history, self.n, logits.shape[-1]))

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

    def fork(self, indices: Tensor) -> NoRepeatNgramState:
        """A new, independent state made of rows `indices (B',)`; this state is unchanged."""
        return self._with_log(self._log.fork(indices), self._holes)

    @classmethod
    def concat(cls, parts: Sequence[NoRepeatNgramState]) -> NoRepeatNgramState:
        """The rows of `parts` (same n) in one state; shorter histories are left-padded."""
        log = RowHistory.concat([part._log for part in parts])
        return parts[0]._with_log(log, any(part._holes for part in parts) or log.has_holes())

    def _with_log(self, log: RowHistory, holes: bool) -> NoRepeatNgramState:
        state = NoRepeatNgramState.__new__(NoRepeatNgramState)
        state.n, state._log, state._holes = self.n, log, holes
        return state
