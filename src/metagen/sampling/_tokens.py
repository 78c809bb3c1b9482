"""Token-id plumbing shared by the penalty and n-gram adapters (private to `metagen.sampling`).

Token histories are LongTensors `(..., T)` whose negative entries are padding and are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

PAD = -1

TokenIds = Tensor | Sequence[int]
PromptIds = Tensor | Sequence[int] | Sequence[Sequence[int]] | None


def check_in_vocab(ids: Tensor, vocab_size: int) -> None:
    """Raise ValueError naming the first id >= vocab_size (one host sync)."""
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"token id {int(ids.max())} is out of range for vocab size {vocab_size}")


def history_for(token_ids: TokenIds, logits: Tensor) -> Tensor:
    """Token ids matching `logits (..., V)` as a LongTensor `(..., T)` on logits' device.

    A plain list of ints is accepted for 1-D logits `(V,)`.
    """
    if isinstance(token_ids, Tensor):
        if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
        ids = token_ids.to(device=logits.device, dtype=torch.long)
    else:
        if logits.dim() != 1:
            raise ValueError(
                "a list of token ids needs 1-D logits (V,); pass a LongTensor (..., T) whose "
                f"batch dims match logits {tuple(logits.shape)}"
            )
        ids = torch.tensor([int(t) for t in token_ids], dtype=torch.long, device=logits.device)
    if ids.dim() < 1 or ids.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"token_ids of shape {tuple(ids.shape)} do not match logits of shape "
            f"{tuple(logits.shape)}: expected {tuple(logits.shape[:-1])} + (T,)"
        )
    check_in_vocab(ids, logits.shape[-1])
    return ids


def rows_of(token_ids: Tensor) -> Tensor:
    """`(..., T) -> (N, T)` with N the product of the batch dims (also when T = 0)."""
    return token_ids.reshape(math.prod(token_ids.shape[:-1]), token_ids.shape[-1])


def token_counts(token_ids: Tensor, vocab_size: int) -> Tensor:
    """How often each token occurs: `(..., T) -> (..., V)` float32; negative ids are ignored.

    Time complexity: O(T + V) per row (one scatter-add).
    """
    check_in_vocab(token_ids, vocab_size)
    flat = rows_of(token_ids)  # (N, T)
    counts = torch.zeros(flat.shape[0], vocab_size, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, flat.clamp(min=0), (flat >= 0).float())
    return counts.reshape(*token_ids.shape[:-1], vocab_size)


def left_aligned(token_ids: Tensor) -> Tensor:
    """Move the padding of each row to its left, keeping the order of real tokens: `(N, T)`.

    Example: [[5, -1, 6, -1]] -> [[-1, -1, 5, 6]]. Afterwards the last n tokens of a row are its
    most recent n tokens, whatever padding convention the caller used.
    """
    is_token = (token_ids >= 0).to(torch.int8)
    order = torch.sort(is_token, dim=-1, stable=True).indices  # padding first, order kept
    return token_ids.gather(-1, order).clamp(min=PAD)


def prompt_matrix(prompt_ids: PromptIds, batch_size: int, device: torch.device | str | None) -> Tensor:
    """Prompt token ids as a left-padded LongTensor `(B, T)` (padding -1).

    Accepts None (empty prompts), one prompt shared by every row (`(T,)` tensor or list of ints),
    a `(B, T)` tensor (negative entries are padding), or B ragged lists of ints.
    """
    if prompt_ids is None:
        return torch.full((batch_size, 0), PAD, dtype=torch.long, device=device)
    if isinstance(prompt_ids, Tensor):
        ids = prompt_ids.to(device=device, dtype=torch.long)
    elif len(prompt_ids) and not isinstance(prompt_ids[0], int) and isinstance(prompt_ids[0], Sequence):
        rows = [[int(t) for t in row] for row in prompt_ids]
        width = max((len(row) for row in rows), default=0)
        padded = [[PAD] * (width - len(row)) + row for row in rows]
        ids = torch.tensor(padded, dtype=torch.long, device=device).reshape(len(rows), width)
    else:
        ids = torch.tensor([int(t) for t in prompt_ids], dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0).expand(batch_size, -1)
    if ids.dim() != 2 or ids.shape[0] != batch_size:
        raise ValueError(
            f"prompt_ids of shape {tuple(ids.shape)} do not match batch_size={batch_size}: "
            "expected (T,) shared by all rows or (B, T)"
        )
    return left_aligned(ids.contiguous())
