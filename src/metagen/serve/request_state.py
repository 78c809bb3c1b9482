"""The engine's state of one request: `EngineRequest`, the caller's `ServeRequest` (its input,
which the engine does not change; its outputs are filled as they come) with the engine's own
typed state, and its `RequestStatus`, which only the scheduler (scheduler.py) sets:

    WAITING --rows given, set up--> PREFILLING --last prompt piece--> RUNNING --every row ended--> FINISHED
    any of the three --> FAILED (an error of its own, of the batch's forward, or the engine stopping),
                         CANCELLED, TIMED_OUT
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metagen.serve.requests import ServeRequest

if TYPE_CHECKING:
    import torch

    from metagen.decoding.batch import RowBatch
    from metagen.decoding.prompt_scoring import PromptScorer
    from metagen.models.cache import RowSnapshot
    from metagen.models.prefix_cache import Node
    from metagen.sampling import SamplingParams
    from metagen.decoding.drafts import Drafter


class RequestStatus(enum.Enum):
    """Where a request is in the engine (the module docstring draws the transitions); the ended
    ones are named as `DoneEvent.outcome` names them."""

    WAITING = "waiting"  # queued, no rows yet
    PREFILLING = "prefilling"  # rows set up (its RowBatch); its prompt forwarded in pieces
    RUNNING = "running"  # its rows decode in the batch
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def queued(self) -> bool:
        """Still in the waiting list (counted by the engine's queue depth)."""
        return self in (RequestStatus.WAITING, RequestStatus.PREFILLING)


@dataclass(eq=False)
class Drafting:
    """One running request's speculation (serve/speculation.py): its drafter (a copy,
    `Drafter.for_request`), each completion's context (prompt + committed tokens; the last, t0,
    not yet in the cache) and its γ."""

    drafter: Drafter
    contexts: list[list[int]]
    gammas: list[int]


@dataclass(eq=False)
class EngineRequest:
    """The engine's state of one request (engine thread only)."""

    request: ServeRequest
    status: RequestStatus = RequestStatus.WAITING
    batch: RowBatch | None = None  # PREFILLING on: its chain, generator, rows and each live row's completion
    prefilled: int = 0  # prompt tokens in its prompt row so far (cached + forwarded)
    prompt_row: RowSnapshot | None = None  # its partly prefilled prompt row between steps (holding its slots)
    scorer: PromptScorer | None = None  # echo: the `PromptScorer` fed by the prefill's pieces
    prefix_node: Node | None = None  # its prompt's node in the prefix cache, locked while it runs
    logits: torch.Tensor | None = None  # RUNNING: (k, V) next-token logits of its k live rows (speculation:
    # only until its first tokens are drawn; then its rows' last tokens wait, unforwarded)
    companion_logits: list[torch.Tensor] = field(default_factory=list)  # RUNNING: each companion's (k, V)
    companion_prompt_rows: list[RowSnapshot | None] = field(default_factory=list)  # each companion's prompt row
    drafting: Drafting | None = None  # RUNNING with speculation: its drafter, contexts and γ

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def live_rows(self) -> int:
        """Cache rows it decodes in now (its n until some end)."""
        return len(self.batch.active)
