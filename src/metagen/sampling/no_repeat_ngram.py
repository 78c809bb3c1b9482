"""No-repeat n-gram blocking (Paulus et al., 2018; the `no_repeat_ngram_size` of Hugging Face).

Ban every token that would complete an n-gram already present in the history x_1..x_T:

    banned = { x_{i+n-1} : (x_i, ..., x_{i+n-2}) = (x_{T-n+2}, ..., x_T),  1 <= i <= T-n+1 }

For n = 1 every token of the history is banned. The match is computed with tensors, with no
Python loop over positions: slide a window of width n over the history, compare the first n-1
tokens of every window with the last n-1 tokens, and scatter the n-th token of each matching
window into a ban mask. Windows that contain padding (negative ids) never match.

`NoRepeatNgramState` keeps a preallocated history buffer (`TokenHistoryState`) so that a decoding
step only writes one column; the ban itself is recomputed from the buffer at each step, so rolling
tokens back is blanking them in the buffer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import float_logits, keep_only
from ._history import TokenHistoryState
from ._tokens import PromptIds, TokenIds, history_for, left_aligned, rows_of


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


class NoRepeatNgramState(TokenHistoryState):
    """History of B rows (prompt + generated tokens) for n-gram blocking (a `LogitsProcessor`).

    The history and how it follows the KV cache are `TokenHistoryState`'s; `apply` recomputes
    the ban from it at each step, so rolling tokens back is blanking them in the buffer.
    """

    name = "no_repeat_ngram"
    argmax_invariant = False

    def __init__(self, n: int, history: Tensor, capacity: int | None = None) -> None:
        self.n = _check_n(n)
        super().__init__(history, capacity)

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
        prompts, capacity = cls.prompt_rows(prompt_ids, batch_size, max_new_tokens, device)
        return cls(n, prompts, capacity=capacity)

    def apply(self, logits: Tensor) -> Tensor:
        """Ban n-gram repeats in `logits (B, V)`; returns new float32 logits. O(B (T n + V))."""
        logits = float_logits(logits)
        return keep_only(logits, ~banned_tokens(self.tokens(), self.n, logits.shape[-1]))
