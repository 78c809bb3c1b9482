"""The model runner: one decode step of the running batch — each request's sampling on its slice
of the logits, then one forward of every row going on (vLLM v1's model runner and sampler).

The cache's rows are grouped by request, in admission order, so request r owns the contiguous
rows `[start_r, start_r + k_r)` and its logits are the slice `logits[start_r : start_r + k_r]`
(a view, no copy):

    sample, for each request r (rows a..b):                 # per-request sampling state
        scores    = combiner.combine([logits[a:b], *companion slices])   # with a combiner, else the logits
        processed = chain_r.process(scores)                 # its own SamplingParams / constraint
        tokens    = chain_r.choose(processed, generator_r)  # its own torch.Generator
        chain_r.accept(tokens)
    records = token_records(rows of a group)               # batched log-softmax / top-k per (greedy, top-k) group
    ... the scheduler pushes the tokens into the rows (`Scheduler.update_from_output`) ...
    select:  cache.select(rows going on, every request)     # finished / cancelled rows leave
    forward: logits = model.forward(cache, last tokens (B, 1))   # one decode forward for every row
             (and each companion's on its own cache, `companions.CompanionCaches`)

Each request draws from its own generator for its own rows only, as `decoding.sample_loop.stream`
does alone, so its output does not depend on its batch companions except through the
floating-point rounding of a batched forward. The records keep the model's own log-probs (not the
combined scores), as the sampling loop's do. Cost per step: one forward of B rows × 1 token per
model; the per-request work is O(k_r · V) for the combiner, the chain and the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from metagen.decoding.records import TokenRecord, token_records
from metagen.serve.requests import DoneEvent

if TYPE_CHECKING:
    from metagen.serve.companions import CompanionCaches
    from metagen.serve.request_state import EngineRequest


@dataclass(eq=False)
class SampledRows:
    """What one decode step produced for one request: its cache rows, its processed logits
    `(k, V)`, the tokens chosen `(k,)` and their records (one per row)."""

    request: EngineRequest
    rows: range
    processed: torch.Tensor
    tokens: torch.Tensor
    records: list[TokenRecord] = field(default_factory=list)


class ModelRunner:
    """The decode step over `model` and the engine's shared `cache` (engine thread only), and
    `companions` (a `CompanionCaches`, or None) whose combiner scores every row."""

    def __init__(self, model, cache, companions: CompanionCaches | None = None) -> None:
        self.model, self.cache, self.companions = model, cache, companions
        self.combiner = None if companions is None else companions.combiner

    def sample(self, decoding: list[tuple[EngineRequest, range]]
               ) -> tuple[list[SampledRows], list[tuple[EngineRequest, DoneEvent]]]:
        """Per request, its chain on its rows' logits with its own generator (`sample_loop.stream`'s
        process -> choose -> accept), then the records of every chosen token (`_records`). Returns
        what was sampled and the requests whose chain raised, each with the event ending it (a
        failure ends that request alone)."""
        sampled, failed = [], []
        for request, rows in decoding:
            chain = request.batch.chain
            try:
                scores = request.logits if self.combiner is None else self.combiner.combine(
                    self.companions.slots.full(request.logits, request.companion_logits))  # (k, V)
                processed = chain.process(scores)  # (k, V)
                tokens = chain.choose(processed, request.batch.generator)  # (k,)
                chain.accept(tokens)
            except Exception as error:  # noqa: BLE001 - fail this request only
                failed.append((request, DoneEvent(f"{type(error).__name__}: {error}")))
                continue
            sampled.append(SampledRows(request, rows, processed, tokens))
        _records(sampled)
        return sampled, failed

    def select(self, kept_rows: list[int]) -> None:
        """Drop the cache rows that ended: one `cache.select` of the rows going on."""
        if len(kept_rows) < self.cache.batch_size:
            self.cache.select(kept_rows)
        if self.companions is not None:
            self.companions.select(kept_rows)

    def forward(self, next_tokens: list[int], running: list[EngineRequest]) -> None:
        """One decode forward of the rows going on (`next_tokens[b]` appended to row b); each
        running request's `logits` become its slice `(k, V)`, a view. Raises what the forward
        raises: the batch is then lost (`reset`)."""
        out = model_forward(self.model, self.cache, next_tokens)
        if self.companions is not None:
            self.companions.forward(torch.tensor(next_tokens, dtype=torch.long)[:, None], running)
        start = 0
        for request in running:
            k = request.live_rows
            request.logits = out.logits[start:start + k]  # (k, V) view
            start += k

    def reset(self) -> None:
        """An empty batch, after a failed forward."""
        self.cache.reset(0)
        if self.companions is not None:
            self.companions.reset()


def _records(sampled: list[SampledRows]) -> None:
    """Fill each request's `records`: one batched `token_records` call per group of requests
    sharing (greedy, number of top log-probs) — usually one group — so that each row gets the
    record its request would get alone (row-wise math: the same values as one call per request),
    greedy rows sampled log-prob 0 (a point mass). O(B V) over the B rows."""
    groups: dict[tuple[bool, int], list[SampledRows]] = {}
    for step in sampled:
        groups.setdefault((step.request.params.greedy, step.request.params.logprobs or 0), []).append(step)
    for (greedy, num_top), steps in groups.items():
        logits = torch.cat([step.request.logits for step in steps])  # (B_g, V)
        tokens = torch.cat([step.tokens for step in steps])  # (B_g,)
        processed = None if greedy else torch.cat([step.processed for step in steps])  # (B_g, V)
        records = token_records(logits, tokens, processed, num_top)
        offset = 0
        for step in steps:
            step.records = records[offset:offset + len(step.rows)]
            offset += len(step.rows)


def model_forward(model, cache, tokens: Sequence[int]):
    """One decode forward: `tokens[b]` appended to row b; logits `(B, V)`."""
    return model.forward(cache, torch.tensor(tokens, dtype=torch.long)[:, None])
