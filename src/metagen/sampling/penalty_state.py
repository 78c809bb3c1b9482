"""Per-row token statistics for the penalties, updated in O(B) per decoding step.

`PenaltyState` holds, for each of the B rows of a batch:

    counts: (B, V) float32   how often each token was *generated* (frequency, presence penalties)
    seen:   (B, V) bool      whether each token occurred in the *prompt or the generation*
                             (repetition penalty)

This is vLLM's convention. Building the statistics from the prompt costs O(B (T + V)) once; each
step then adds one token per row with a scatter, so the per-token cost of the penalties is O(B V)
(the element-wise update of the logits) and never depends on the sequence length.

For `rollback` (speculative rejection) the state also keeps the prompt's `seen` and a log of the
generated tokens (`RowHistory`): undoing k tokens subtracts them from `counts` and recomputes
`seen = prompt_seen | counts > 0`, O(B (T + V)), exactly the state that never accepted them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._history import RowHistory
from ._tokens import PAD, PromptIds, prompt_matrix, token_counts
from .penalties import (
    frequency_penalty_from_counts,
    presence_penalty_from_counts,
    repetition_penalty_from_mask,
)
from .processor import LogitsProcessor


class PenaltyState(LogitsProcessor):
    """Token counts of B rows and the three penalties applied with them (a `LogitsProcessor`).

    Attributes:
        counts: `(B, V)` float32 occurrence counts of generated tokens.
        seen: `(B, V)` bool, True for tokens of the prompt or the generation.
        repetition_penalty, frequency_penalty, presence_penalty: what `apply` uses by default.
    """

    name = "penalties"
    argmax_invariant = False

    def __init__(
        self,
        counts: Tensor,
        seen: Tensor,
        *,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        prompt_seen: Tensor | None = None,
    ) -> None:
        if counts.dim() != 2 or seen.shape != counts.shape or seen.dtype != torch.bool:
            raise ValueError(
                f"counts (B, V) and seen (B, V) bool must agree, got {tuple(counts.shape)} and "
                f"{tuple(seen.shape)} {seen.dtype}"
            )
        self.counts = counts.float()
        self.seen = seen
        # What `seen` falls back to when generated tokens are rolled back.
        self.prompt_seen = prompt_seen if prompt_seen is not None else seen & (self.counts == 0)
        self.repetition_penalty = repetition_penalty
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        empty = torch.full((counts.shape[0], 0), PAD, dtype=torch.long, device=counts.device)
        self.generated = RowHistory(empty, PAD)

    @classmethod
    def from_prompt(
        cls,
        prompt_ids: PromptIds,
        batch_size: int,
        vocab_size: int,
        device: torch.device | str | None = None,
        **penalties: float,
    ) -> PenaltyState:
        """Statistics after the prompt: nothing generated yet, prompt tokens `seen`.

        Args:
            prompt_ids: None, one prompt for every row (`(T,)` tensor or list of ints), a `(B, T)`
                LongTensor (negative entries are padding) or B lists of ints.
            batch_size: B.
            vocab_size: V.
            device: where the state lives; defaults to the prompt tensor's device, else CPU.
            penalties: repetition_penalty / frequency_penalty / presence_penalty for `apply`.
        """
        if device is None and isinstance(prompt_ids, Tensor):
            device = prompt_ids.device
        prompts = prompt_matrix(prompt_ids, batch_size, device)  # (B, T)
        seen = token_counts(prompts, vocab_size) > 0  # (B, V)
        counts = torch.zeros(batch_size, vocab_size, dtype=torch.float32, device=prompts.device)
        return cls(counts, seen, prompt_seen=seen.clone(), **penalties)

    @property
    def batch_size(self) -> int:
        return self.counts.shape[0]

    def accept(self, tokens: Tensor) -> None:
        """Record one new token per row: `tokens (B,)`; negative entries (finished rows) are
        skipped. O(B), no host synchronisation."""
        tokens = tokens.reshape(-1, 1).to(device=self.counts.device, dtype=torch.long)  # (B, 1)
        is_token = tokens >= 0
        index = tokens.clamp(min=0)
        self.counts.scatter_add_(1, index, is_token.float())
        # Write back `seen | is_token` so that skipped rows keep their value at index 0.
        self.seen.scatter_(1, index, self.seen.gather(1, index) | is_token)
        self.generated.accept(tokens.squeeze(1), is_token.squeeze(1))

    def rollback(self, counts: Tensor) -> None:
        """Forget the last `counts[b]` generated tokens of row b. O(B (T + V))."""
        removed = self.generated.rollback(counts)
        self.counts.scatter_add_(1, removed.values.clamp(min=0), -removed.mask.float())
        self.seen = self.prompt_seen | (self.counts > 0)

    def reset(self) -> None:
        """Forget every generated token: the state right after the prompt."""
        self.rollback(self.generated.accepted)

    def select(self, indices: Tensor) -> None:
        """Keep rows `indices (B',)` in that order (rows may repeat or vanish), in place: follows
        a KV-cache reorder after beam search or forking."""
        indices = indices.to(device=self.counts.device, dtype=torch.long)
        self.counts = self.counts[indices]
        self.seen = self.seen[indices]
        self.prompt_seen = self.prompt_seen[indices]
        self.generated.select(indices)

    def fork(self, indices: Tensor) -> PenaltyState:
        """A new, independent state made of rows `indices (B',)`; this state is unchanged."""
        indices = indices.to(device=self.counts.device, dtype=torch.long)
        forked = PenaltyState(self.counts[indices], self.seen[indices], prompt_seen=self.prompt_seen[indices],
                              **self._penalties())
        forked.generated = self.generated.fork(indices)
        return forked

    @classmethod
    def concat(cls, parts: Sequence[PenaltyState]) -> PenaltyState:
        """The rows of `parts` (same penalties) in one state."""
        joined = PenaltyState(torch.cat([p.counts for p in parts]), torch.cat([p.seen for p in parts]),
                              prompt_seen=torch.cat([p.prompt_seen for p in parts]), **parts[0]._penalties())
        joined.generated = RowHistory.concat([p.generated for p in parts])
        return joined

    def _penalties(self) -> dict[str, float]:
        return {"repetition_penalty": self.repetition_penalty, "frequency_penalty": self.frequency_penalty,
                "presence_penalty": self.presence_penalty}

    def apply(
        self,
        logits: Tensor,
        repetition_penalty: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
    ) -> Tensor:
        """Apply the three penalties to `logits (B, V)` (repetition first, as in vLLM); returns
        new float32 logits. A penalty not given is the state's own; penalties at their neutral
        value are skipped. O(B V)."""
        repetition_penalty = self.repetition_penalty if repetition_penalty is None else repetition_penalty
        frequency_penalty = self.frequency_penalty if frequency_penalty is None else frequency_penalty
        presence_penalty = self.presence_penalty if presence_penalty is None else presence_penalty
        original = logits
        logits = logits.float()
        if repetition_penalty != 1.0:
            logits = repetition_penalty_from_mask(logits, self.seen, repetition_penalty)
        if frequency_penalty != 0.0:
            logits = frequency_penalty_from_counts(logits, self.counts, frequency_penalty)
        if presence_penalty != 0.0:
            logits = presence_penalty_from_counts(logits, self.counts, presence_penalty)
        return logits.clone() if logits is original else logits
