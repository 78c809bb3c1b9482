"""`LazyCompanions`: companion models whose caches catch up only when a step needs their logits.

A switching combiner (`combine.SwitchingCombiner`: entropy-adaptive decoding) reads its
companions' logits at some steps only. Running them at every step would cost their forwards
for nothing; skipping them would leave their caches behind the rows. So `RowBatch` keeps, per
row, the tokens the main model was fed since the companions last ran (`pending`), and when a
step needs them each companion runs once over every row's pending tokens (ragged rows allowed):

    lazy.fed(tokens)                         # every forward: the fed tokens join each row's pending
    logits, cost = lazy.sync(starts_after)   # when needed: the prompt (first time), then one
                                             #   forward of the pending tokens; (B, V) per companion

After `sync`, companion row b holds exactly the main row's tokens, so its logits are those of a
fresh prefill of the same prefix: the output is a function of the full prefix whichever model
gave the earlier tokens. The first sync prefills the prompt (once, forked into the live rows).

Cost: only the forwards run are counted (`cost.prefill_cost` / `forward_cost`, `produced=False`:
the target steps are the main model's). `select` / `truncate` are O(B) list moves plus the
caches' own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metagen.decoding.cost import Cost, forward_cost, prefill_cost


class LazyCompanions:
    """Companions of one request, synced on demand.

    Attributes:
        caches: each companion's cache, None until the first `sync` (the prompt not yet run).
        pending: per live row, the tokens fed to the main model that the companions have not seen.
    """

    def __init__(self, companions: Sequence, prompt_ids: list[int], rows: int) -> None:
        self.companions, self.prompt_ids = tuple(companions), prompt_ids
        self.caches: list = [None] * len(self.companions)
        self.pending: list[list[int]] = [[] for _ in range(rows)]

    def fed(self, tokens: torch.Tensor | Sequence[Sequence[int]]) -> None:
        """Row b was fed `tokens[b]` (a (B, T) tensor or B lists) by the main model."""
        rows = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
        for pending, new in zip(self.pending, rows):
            pending.extend(int(t) for t in new)

    def sync(self) -> tuple[list[torch.Tensor], Cost]:
        """Bring every companion up to the main rows; returns each one's next-token logits (B, V)
        and the `Cost` of what ran: the prompt's prefill the first time (one forward, forked into
        the B live rows), then one forward of the pending tokens when any row has some (every
        row has, in the sampling loop: its last fed token). O(Σ_b pending[b]) tokens per model."""
        rows, cost, logits = len(self.pending), Cost(), []
        counts = [len(p) for p in self.pending]
        for i, companion in enumerate(self.companions):
            out = None
            if self.caches[i] is None:
                self.caches[i], out = companion.prefill(self.prompt_ids, batch_size=rows)
                cost += prefill_cost(companion, len(self.prompt_ids), rows, produced=False)
            if any(counts):
                if not all(counts):
                    raise ValueError("a lazy companion's rows must all have pending tokens to sync together")
                starts = self.caches[i].lengths
                out = companion.forward(self.caches[i], self.pending)
                cost += forward_cost(companion, starts, counts, produced=False)
            if out is None:
                raise ValueError("nothing to sync: the companions already hold every fed token")
            logits.append(out.logits)  # (B, V)
        self.pending = [[] for _ in range(rows)]
        return logits, cost

    def select(self, indices: Sequence[int]) -> None:
        """Rows become `[rows[i] for i in indices]` (repeats fork), pending tokens with them."""
        self.pending = [list(self.pending[i]) for i in indices]
        for cache in self.caches:
            if cache is not None:
                cache.select(indices)

    def truncate(self, row: int, length: int) -> None:
        """Main row `row` rolls back to `length` tokens: the pending tokens past it leave, and the
        companions' row too when it holds more."""
        cache = next((c for c in self.caches if c is not None), None)
        synced = len(self.prompt_ids) if cache is None else cache.length(row)
        if length >= synced:
            del self.pending[row][length - synced:]
            return
        self.pending[row] = []
        for cache in self.caches:
            cache.truncate(row, length)
