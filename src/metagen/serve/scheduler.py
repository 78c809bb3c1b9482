"""The engine's scheduler: the requests' state, and each step which requests leave, get rows,
prefill how much and decode.

As in vLLM v1, the scheduler decides and owns the requests; the engine (engine.py) runs the
step: the model runner (model_runner.py) forwards the batch and runs each request's chain,
chunked prefill (chunked_prefill.py) forwards the prompts. The scheduler touches neither the
model nor the cache's tensors; it holds the requests in two lists, answers three questions

    admit(now)          waiting requests cancelled or past their deadline (they leave), and those
                        given rows: first come, first served while the rows of the running and
                        admitted requests stay within `max_rows`; a request whose rows do not fit
                        holds back the ones behind it (no overtaking)
    plan_prefill(reqs)  prompt tokens each admitted request forwards this step, at most
                        `prefill_chunk` in all (`prefill_plan`)
    decode(now)         running requests cancelled or past their deadline, and the cache rows of
                        the others (rows are grouped by request in admission order)

and applies the outcome of each step to them: `start_prefill`, `start_running`,
`update_from_output` (a decode step's tokens pushed into the rows), `settle` (the rows that
ended leave; the speculative stage's rows are pushed by their verification) and `finish`, the one way out
of the engine for every request — finished, failed, cancelled, past its deadline, or still there
when the engine stops (shutdown, or a fault of its loop).

Each request the engine holds is an `EngineRequest` (request_state.py), with a `RequestStatus`
that only the scheduler sets.

Cost: O(requests) per call, plus `prefill_plan`'s O(admitted).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metagen.serve.prefix_manager import PrefixCacheManager
from metagen.serve.request_state import EngineRequest, RequestStatus
from metagen.serve.requests import DoneEvent, EngineStats, QueueFullError, ServeRequest, TokenEvent

if TYPE_CHECKING:
    from metagen.serve.model_runner import SampledRows


@dataclass
class Admission:
    """The scheduler's admission decision: waiting requests that leave with their event, and
    those given rows this step, in arrival order."""

    stopped: list[tuple[EngineRequest, DoneEvent]]
    admitted: list[EngineRequest]


@dataclass
class DecodeSchedule:
    """The scheduler's decode decision: running requests that leave with their event, and each
    other running request with its cache rows `[start, start + k)` (the rows of the leaving ones
    are left out, so the engine drops them with the finished ones)."""

    stopped: list[tuple[EngineRequest, DoneEvent]] = field(default_factory=list)
    decoding: list[tuple[EngineRequest, range]] = field(default_factory=list)


def prefill_plan(remaining: list[int], budget: int) -> list[int]:
    """Prompt tokens to forward this step for each waiting prompt (arrival order; `remaining`: the
    tokens each has still to prefill), at most `budget` in all: the oldest first gets up to half
    the budget (a long prompt always advances), then every prompt whose rest fits in what is left
    gets all of it, in order (a short prompt arriving behind a long one is not held up for the
    whole long prefill), then what is left goes to the rest in order. Without other prompts the
    oldest gets min(rest, budget), as first come, first served would give it. O(len(remaining)).

        prefill_plan([3000, 40, 10], 256) == [206, 40, 10]
    """
    plan = [0] * len(remaining)
    if not remaining:
        return plan
    plan[0] = min(remaining[0], (budget + 1) // 2)
    left = budget - plan[0]
    for index, total in enumerate(remaining):
        if 0 < total - plan[index] <= left:
            left -= total - plan[index]
            plan[index] = total
    for index, total in enumerate(remaining):
        take = min(total - plan[index], left)
        plan[index] += take
        left -= take
    return plan


class Scheduler:
    """The waiting and running requests, the decisions over them and their state (see the module
    docstring); engine thread only, but `reserve` and `queue_depth`.

    waiting: arrival order (WAITING and PREFILLING); running: admission order, which is the order
    of their rows in the engine's cache. `max_queue`: most requests submitted and not yet running.
    `prefixes`: what the requests hold of the KV cache, let go when they end (default: no prefix
    cache, no cache). `stats`: the counters the scheduler writes (requests by outcome, tokens).
    """

    def __init__(self, max_rows: int, prefill_chunk: int, max_queue: int = 64, *,
                 prefixes: PrefixCacheManager | None = None, stats: EngineStats | None = None) -> None:
        self.max_rows, self.prefill_chunk, self.max_queue = max_rows, prefill_chunk, max_queue
        self.stats = EngineStats() if stats is None else stats
        self.prefixes = PrefixCacheManager(None, None, self.stats) if prefixes is None else prefixes
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self._queued = 0  # submitted (`reserve`) and not yet running nor ended
        self._lock = threading.Lock()  # guards _queued against concurrent submits

    # ------------------------------------------------------------------ any thread

    def reserve(self) -> None:
        """Count one more submitted request in the queue depth; QueueFullError when `max_queue`
        requests already wait."""
        with self._lock:
            if self._queued >= self.max_queue:
                raise QueueFullError(f"{self._queued} requests are waiting (--max-queue {self.max_queue})")
            self._queued += 1

    @property
    def queue_depth(self) -> int:
        """Requests submitted and not yet admitted to the batch (nor ended)."""
        return self._queued

    # ------------------------------------------------------------------ engine thread

    def add(self, request: ServeRequest) -> EngineRequest:
        """A submitted (`reserve`d) request joins the waiting list."""
        state = EngineRequest(request)
        self.waiting.append(state)
        return state

    def rows_in_use(self) -> int:
        return sum(request.live_rows for request in self.running)

    def admit(self, now: float) -> Admission:
        """Waiting requests that leave (cancelled, past their deadline) and those given rows (the
        module docstring). O(waiting + running)."""
        stopped, admitted = [], []
        free = self.max_rows - self.rows_in_use()
        blocked = False
        for request in self.waiting:
            event = request.request.stopped(now)
            if event is not None:
                stopped.append((request, event))
            elif blocked or request.params.n > free:
                blocked = True  # no overtaking for rows
            else:
                admitted.append(request)
                free -= request.params.n
        return Admission(stopped, admitted)

    def plan_prefill(self, admitted: list[EngineRequest]) -> list[tuple[EngineRequest, int]]:
        """Each admitted (and set up) request with the prompt tokens it forwards this step."""
        plan = prefill_plan([len(request.prompt_ids) - request.prefilled for request in admitted], self.prefill_chunk)
        return list(zip(admitted, plan))

    def decode(self, now: float) -> DecodeSchedule:
        """Running requests that leave (cancelled, past their deadline) and the rows of the
        others (the module docstring). O(running)."""
        schedule = DecodeSchedule()
        start = 0
        for request in self.running:
            rows = range(start, start + request.live_rows)
            start = rows.stop
            event = request.request.stopped(now)
            if event is not None:
                schedule.stopped.append((request, event))
            else:
                schedule.decoding.append((request, rows))
        return schedule

    def start_prefill(self, request: EngineRequest) -> None:
        """An admitted request whose rows are set up: its prompt is forwarded from now on."""
        request.status = RequestStatus.PREFILLING

    def start_running(self, request: EngineRequest) -> None:
        """A request whose prompt is all in: its rows are the last of the batch."""
        self._leave_waiting(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING

    def update_from_output(self, sampled: list[SampledRows]) -> tuple[list[int], list[int]]:
        """Apply one decode step's output to the requests: each row takes its token
        (`RowBatch.push`: stop rules, text, records; a `TokenEvent` each), then `settle`. Returns
        the cache rows of the rows going on and their last tokens."""
        for step in sampled:
            request, batch = step.request, step.request.batch
            chosen = step.tokens.tolist()
            for b, (index, token) in enumerate(zip(batch.active, chosen)):
                text = batch.push(b, token, step.records[b])
                completion = batch.rows[index].completion
                request.request.emit(TokenEvent(index, text, token, step.records[b], completion.finish_reason,
                                                completion.stop_reason))
            self.stats.generated_tokens += len(chosen)
        kept_rows = self.settle([(step.request, step.rows) for step in sampled])
        next_tokens = [request.batch.rows[index].completion.token_ids[-1]
                       for request in self.running for index in request.batch.active]
        return kept_rows, next_tokens

    def settle(self, stepped: list[tuple[EngineRequest, range]]) -> list[int]:
        """After the rows of `stepped` (each running request still in the batch, with its cache
        rows, in batch order) took their tokens: the rows that ended are indexed in the prefix
        cache and leave their request's `RowBatch`; a request whose rows all ended finishes
        (`finish`). The running list becomes the requests going on; returns their cache rows
        (the engine selects them: the others leave the cache)."""
        kept_rows: list[int] = []
        going_on: list[EngineRequest] = []
        for request, rows in stepped:
            batch = request.batch
            keep = batch.live()
            if len(keep) < len(rows):
                self.prefixes.cache_finished(request, rows, keep)
            if not keep:
                self.finish(request, DoneEvent())
                continue
            batch.keep(keep)  # its chain and rows; the shared cache's rows are selected by the engine
            kept_rows += [rows[b] for b in keep]
            going_on.append(request)
        self.running = going_on
        return kept_rows

    def finish(self, request: EngineRequest, event: DoneEvent) -> None:
        """The one way out of the engine: `request` leaves the waiting list (its partial prompt
        row released) or the batch (its cache rows are dropped by the next `cache.select`), takes
        its final status, is counted under its outcome, has its prompt unlocked in the prefix
        cache (`PrefixCacheManager.free`) and gets `event`, its one `DoneEvent` — even when
        letting go of its slots fails (the engine stopping on a fault of its loop)."""
        if request.status.queued:
            self._leave_waiting(request)
        else:
            self.running.remove(request)
        request.status = RequestStatus(event.outcome)
        self.stats.count(event)
        try:
            self.prefixes.free(request)
        finally:
            request.request.emit(event)

    def finish_all(self, reason: str) -> None:
        """The engine stops: every waiting and running request ends with `reason` (`finish`)."""
        errors = []
        for request in self.waiting + self.running:
            try:
                self.finish(request, DoneEvent(reason))
            except Exception as error:  # noqa: BLE001 - answered all the same; the others must be too
                errors.append(error)
        if errors:
            raise errors[0]

    def _leave_waiting(self, request: EngineRequest) -> None:
        self.waiting.remove(request)
        with self._lock:
            self._queued -= 1
