"""The contracts of the speculative loop (`draft_loop`): a `Draft`, the `Drafter` that proposes
it, the `Verification` that turns a forward over it into tokens, the `DraftSchedule` of its
lengths. Drafters and verifications live in `metagen.speculative` (models, n-gram tables; the
token / block / greedy rules) and here (`jump_forward.ForcedRunDrafter`, `draw_verify`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.result import StreamEvent
from metagen.sampling import SamplerChain

__all__ = ["Draft", "DraftSchedule", "Drafter", "Outcomes", "Verification"]

Outcomes = list[tuple[int, int]]  # per live row: (tau, x) — d_1..d_tau taken, then x


@dataclass
class Draft:
    """Proposed tokens per row and where they came from.

    tokens: per row, 0..γ_b token ids.
    probs: per row, `(len(tokens[b]), V)` float32 distributions the tokens were drawn from, or
        None for a deterministic proposal (a point mass on each token).
    calls: drafter forwards spent (batched calls count once); flops: their estimated FLOPs.
    """

    tokens: list[list[int]]
    probs: list[Tensor | None]
    calls: int = 0
    flops: float = 0.0


class Drafter(ABC):
    """Proposes draft tokens for a batch of rows.

    A drafter sees each row's committed tokens (prompt + generated, the last one not yet run
    through the target) and proposes up to γ_b tokens per row together with the distributions
    they were drawn from (after the same sampler chain as the target, so the verification rules
    compare like with like). Deterministic drafters (n-gram lookup, greedy drafts, forced runs)
    return point masses.

        drafter.start(prompt_ids, batch_size)            # once per request
        draft = drafter.propose(contexts, lengths, chain, generator)
        drafter.select(rows)                             # rows leaving / reordering the batch
        drafter.finish(outputs)                          # end of the request
    """

    name: str = "drafter"
    vocab_size: int | None = None  # None: any vocabulary (token-id based drafters)
    prefill_flops: float = 0.0  # FLOPs `start` spent (set by drafters that run a model)
    forced: bool = False  # True: proposes the text processors force (counted as forced tokens)

    def start(self, prompt_ids: Sequence[int], batch_size: int, target_cache=None) -> None:
        """Begin a request whose rows all start from `prompt_ids`; `target_cache` holds the
        target's prefilled prompt (row 0), for drafters that can reuse it."""

    @abstractmethod
    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        lengths: Sequence[int],
        chain: SamplerChain,
        generator: torch.Generator | None,
    ) -> Draft:
        """Up to `lengths[b]` tokens following `contexts[b]` (the row's committed tokens).

        `chain` is the target's sampler chain for these rows (state up to the committed tokens);
        a drafter that samples forks it and never changes it.
        """

    def select(self, rows: Sequence[int]) -> None:
        """Row i becomes old row `rows[i]` (finished rows leave the batch)."""

    def finish(self, outputs: Sequence[Sequence[int]]) -> None:
        """The request ended with these generated token ids per row."""


class Verification(ABC):
    """Turns one forward over the drafts into tokens pushed into the rows.

    `verify` leaves the chain advanced by exactly the tokens it pushed, yields the rows' events
    and returns each live row's `(tau, x)`: its draft tokens d_1..d_tau were taken, then x (a
    row that finished took at most these). `spare`: tokens of a row's budget a draft leaves
    free (1 when a token after the draft is always drawn, 0 when drawing stops where the row ends).
    """

    spare: int = 1

    @abstractmethod
    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        """`logits (B, 1 + longest draft, V)`: position j of row b follows its t0 and d_1..d_j."""


class DraftSchedule(Protocol):
    """γ per row: `num_draft_tokens` to start, then `next_length` after each step."""

    num_draft_tokens: int

    def next_length(self, gamma: int, proposed: int, accepted: int) -> int: ...
