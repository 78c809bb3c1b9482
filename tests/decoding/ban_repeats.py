"""A stateful test processor: each row remembers the tokens it accepted and bans them.

It keeps its state as plain Python lists (no tensor tricks), so a loop that forgets to follow its
cache with the processor (fork, select, rollback, concat) leaves a row with another row's history
or with rejected draft tokens, and the generated sequences then repeat tokens or miss ones that
should be allowed. `allows_stop` / `finished` hooks are optional: `stop_after` makes a row end as
soon as it holds that many tokens (a processor saying "must end here"), and `min_tokens` forbids
ending earlier (complete=False when a row ends anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from metagen.sampling import LogitsProcessor


class BanRepeats(LogitsProcessor):
    """Bans every token a row has accepted; `histories[b]` is row b's accepted tokens."""

    name = "ban_repeats"
    argmax_invariant = False

    def __init__(self, histories: Sequence[Sequence[int]] = ((),), *, never_banned: Sequence[int] = ()) -> None:
        self.histories = [list(h) for h in histories]
        self.never_banned = frozenset(never_banned)
        self.events: list[str] = []

    @property
    def batch_size(self) -> int:
        return len(self.histories)

    def apply(self, logits: Tensor) -> Tensor:
        if logits.shape[0] != len(self.histories):
            raise AssertionError(f"logits for {logits.shape[0]} rows, state of {len(self.histories)}")
        out = logits.float().clone()
        for b, history in enumerate(self.histories):
            banned = [t for t in history if t not in self.never_banned]
            if banned:
                out[b, banned] = float("-inf")
        return out

    def accept(self, tokens: Tensor) -> None:
        tokens = tokens.tolist()
        if len(tokens) != len(self.histories):
            raise AssertionError(f"{len(tokens)} tokens for {len(self.histories)} rows")
        for history, token in zip(self.histories, tokens):
            if token >= 0:
                history.append(token)
        self.events.append("accept")

    def rollback(self, counts: Tensor) -> None:
        for history, count in zip(self.histories, counts.tolist()):
            if count > len(history):
                raise ValueError(f"rollback of {count} tokens, only {len(history)} accepted")
            del history[len(history) - count:]
        self.events.append("rollback")

    def select(self, indices: Tensor) -> None:
        self.histories = [list(self.histories[i]) for i in indices.tolist()]
        self.events.append("select")

    def fork(self, indices: Tensor) -> BanRepeats:
        forked = type(self)([self.histories[i] for i in indices.tolist()], never_banned=self.never_banned)
        self._copy_settings(forked)
        return forked

    def _copy_settings(self, other: BanRepeats) -> None:
        other.events = self.events  # one log for every copy of the state

    def reset(self) -> None:
        self.histories = [[] for _ in self.histories]

    @classmethod
    def concat(cls, parts: Sequence[BanRepeats]) -> BanRepeats:
        joined = cls([h for part in parts for h in part.histories], never_banned=parts[0].never_banned)
        parts[0]._copy_settings(joined)
        joined.events.append("concat")
        return joined


class EndAfter(BanRepeats):
    """BanRepeats that also judges where rows end: a row must end once it holds `stop_after`
    tokens, and may end only once it holds `min_tokens`."""

    name = "end_after"

    def __init__(self, histories=((),), *, stop_after: int = 10**9, min_tokens: int = 0, never_banned=()) -> None:
        super().__init__(histories, never_banned=never_banned)
        self.stop_after, self.min_tokens = stop_after, min_tokens

    def _copy_settings(self, other: EndAfter) -> None:
        super()._copy_settings(other)
        other.stop_after, other.min_tokens = self.stop_after, self.min_tokens

    def allows_stop(self, row: int) -> bool:
        return len(self.histories[row]) >= self.min_tokens

    def finished(self, row: int) -> bool:
        return len(self.histories[row]) >= self.stop_after


def no_repeats(sequence: Sequence[int], allowed_repeats: Sequence[int] = ()) -> bool:
    body = [t for t in sequence if t not in allowed_repeats]
    return len(body) == len(set(body))


def distribution_without_repeats(prompt: Sequence[int], max_tokens: int) -> dict[tuple[int, ...], float]:
    """Exact law of the toy model's completions when each step bans the tokens generated before
    it (BanRepeats in a sampling loop); sequences with a repeat have probability 0."""
    from tests.decoding.toy_model import enumerate_sequences, next_logits

    distribution = {}
    for sequence in enumerate_sequences(max_tokens):
        logprob = 0.0
        for i, token in enumerate(sequence):
            logits = next_logits([*prompt, *sequence[:i]]).double()
            logits[list(sequence[:i])] = float("-inf")
            logprob += float(torch.log_softmax(logits, dim=-1)[token])
        distribution[sequence] = math.exp(logprob)
    return distribution
