"""Per-row token statistics for the penalties, updated in O(B) per decoding step.

`PenaltyState` holds, for each of the B rows of a batch:

    counts: (B, V) float32   how often each token was *generated* (frequency, presence penalties)
    seen:   (B, V) bool      whether each token occurred in the *prompt or the generation*
                             (repetition penalty)

This is vLLM's convention. Building the statistics from the prompt costs O(B (T + V)) once; each
step then adds one token per row with a scatter, so the per-token cost of the penalties is O(B V)
(the element-wise update of the logits) and never depends on the sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._tokens import PromptIds, prompt_matrix, token_counts
from .penalties import (
    frequency_penalty_from_counts,
    presence_penalty_from_counts,
    repetition_penalty_from_mask,
)


class PenaltyState:
    """Token counts of B rows; mutable, owned by one decoding loop.

    Attributes:
        counts: `(B, V)` float32 occurrence counts of generated tokens.
        seen: `(B, V)` bool, True for tokens of the prompt or the generation.
    """

    def __init__(self, counts: Tensor, seen: Tensor) -> None:
        if counts.dim() != 2 or seen.shape != counts.shape or seen.dtype != torch.bool:
            raise ValueError(
                f"counts (B, V) and seen (B, V) bool must agree, got {tuple(counts.shape)} and "
                f"{tuple(seen.shape)} {seen.dtype}"
            )
        self.counts = counts.float()
        self.seen = seen

    @classmethod
    def from_prompt(
        cls,
        prompt_ids: PromptIds,
        batch_size: int,
        vocab_size: int,
        device: torch.device | str | None = None,
    ) -> PenaltyState:
        """Statistics after the prompt: nothing generated yet, prompt tokens `seen`.

        Args:
            prompt_ids: None, one prompt for every row (`(T,)` tensor or list of ints), a `(B, T)`
                LongTensor (negative entries are padding) or B lists of ints.
            batch_size: B.
            vocab_size: V.
            device: where the state lives; defaults to the prompt tensor's device, else CPU.
        """
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        prompts = prompt_matrix(prompt_ids, batch_size, device)  # (B, T)
        seen = token_counts(prompts, vocab_size) > 0  # (B, V)
        counts = torch.zeros(batch_size, vocab_size, dtype=torch.float32, device=prompts.device)
        return cls(counts, seen)

    @property
    def batch_size(self) -> int:
        return self.counts.shape[0]

    def update(self, new_tokens: Tensor) -> None:
        """Record one new token per row: `new_tokens (B,)`; negative entries (finished rows) are
        skipped. O(B), no host synchronisation."""
        tokens = new_tokens.reshape(-1, 1).to(device=self.counts.device, dtype=torch.long)  # (B, 1)
        is_token = tokens >= 0
        index = tokens.clamp(min=0)
        self.counts.scatter_add_(1, index, is_token.float())
        # Write back `seen | is_token` so that skipped rows keep their value at index 0.
        self.seen.scatter_(1, index, self.seen.gather(1, index) | is_token)

    def select(self, indices: Tensor) -> None:
        """Keep rows `indices (B',)` in that order (rows may repeat or vanish), in place: follows
        a KV-cache reorder after beam search or forking."""
        indices = indices.to(device=self.counts.device, dtype=torch.long)
        self.counts = self.counts[indices]
        self.seen = self.seen[indices]

    def fork(self, indices: Tensor) -> PenaltyState:
        """A new, independent state made of rows `indices (B',)`; this state is unchanged."""
        indices = indices.to(device=self.counts.device, dtype=torch.long)
        return PenaltyState(self.counts[indices], self.seen[indices])

    def apply(
        self,
        logits: Tensor,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
    ) -> Tensor:
        """Apply the three penalties to `logits (B, V)` (repetition first, as in vLLM); returns
        new float32 logits. Penalties at their neutral value are skipped. O(B V)."""
        original = logits
        logits = logits.float()
        if repetition_penalty != 1.0:
            logits = repetition_penalty_from_mask(logits, self.seen, repetition_penalty)
        if frequency_penalty != 0.0:
            logits = frequency_penalty_from_counts(logits, self.counts, frequency_penalty)
        if presence_penalty != 0.0:
            logits = presence_penalty_from_counts(logits, self.counts, presence_penalty)
        return logits.clone() if logits is original else logits
