"""The serving engine's core: one thread owns the model and one KV cache and runs continuous
batching; requests join and leave the running batch at step boundaries.

As in vLLM v1's EngineCore, the engine loops over its parts, each in its own module: the
scheduler (scheduler.py) decides and owns the requests' state, chunked prefill
(chunked_prefill.py) forwards the prompts, the model runner (model_runner.py) samples and
forwards the batch, and the prefix-cache manager (prefix_manager.py) holds what the requests
keep of the cache. One step:

    _admit: scheduler.admit(now)              # waiting requests leaving; those given rows (FCFS)
        _start (new ones): prefill.start      # RowBatch.start; its cached prefix as its prompt row
                           scheduler.start_prefill
        scheduler.plan_prefill(started)       # at most `prefill_chunk` prompt tokens (`prefill_plan`)
        _prefill, per prompt: prefill.prefill # its next piece forwarded alone on its prompt row
            last piece -> scheduler.start_running   # its n rows joined the batch
    _step: scheduler.decode(now)              # running requests leaving; each other's rows
        runner.sample(decoding)               # each request's chain on its slice, its own generator
        scheduler.update_from_output(sampled) # tokens pushed into the rows, finished rows cached
        _forward: runner.select(rows going on), runner.forward(their last tokens)   # one decode forward

Every request leaves through `Scheduler.finish` — finished, failed, cancelled (the client gone),
past its deadline, and when the engine stops (`stop`, or a fault of the loop itself: `_run`'s
`finally` marks the engine dead, so later submissions raise `EngineStoppedError`, drains the
queue and ends every waiting and running request with the reason): out of the waiting list or
the batch, its final status, counted, its prefix unlocked, its one `DoneEvent`.

With a drafter (`drafter=`, `metagen serve --speculative`) the decode step is the draft / verify
stage of speculation.py instead: those that just joined draw their first tokens, the rows that
ended leave (`Scheduler.settle`), then every running request drafts, ONE ragged forward scores
[t0] + draft for every row, and each request verifies its rows as `metagen generate
--speculative` does (`draft_loop.verify_drafts`), pushing one or more tokens per row.

A server-wide logits combiner (`combiner=`: contrastive decoding, DExperts) runs its companion
models on the same rows (companions.py): every cache step above is taken by their caches too,
and each request's sampler chain processes the combined scores of its rows.

Cost per step: one forward of B rows × 1 token (per model) plus the prefill forwards of at most
`prefill_chunk` prompt tokens (one per prompt touched) with two snapshots of the running rows'
page tables each; the per-request work is O(k_r · V) for the chain and the records.

Thread model: `submit` (any thread) puts a `ServeRequest` in a bounded queue (the engine thread
holds each as an `EngineRequest` once it takes it); the engine thread
is the only one touching the model, the cache, the chains and the rows. Events go back through
`ServeRequest.emit`, a callback the caller provides (the HTTP layer hands them to its event
loop). `cancel()` from any thread marks a request; its rows leave at the next step boundary.
"""

from __future__ import annotations

import queue
import threading
import time

from metagen.decoding.combine import LogitsCombiner
from metagen.decoding.drafts import Drafter
from metagen.models.base import PagedCache
from metagen.models.prefix_cache import PrefixCache
from metagen.serve.chunked_prefill import ChunkedPrefill
from metagen.serve.companions import CompanionCaches
from metagen.serve.model_runner import ModelRunner
from metagen.serve.prefix_manager import PrefixCacheManager
from metagen.serve.requests import DoneEvent, EngineStats, EngineStoppedError, QueueFullError, ServeRequest, TokenEvent
from metagen.serve.request_state import EngineRequest, RequestStatus
from metagen.serve.scheduler import Scheduler
from metagen.serve.speculation import SpeculativeStage
from metagen.speculative.loop import SpeculativeConfig

__all__ = ["DEFAULT_CACHE_MEMORY", "DEFAULT_PREFILL_CHUNK", "DoneEvent", "Engine", "EngineStats", "EngineStoppedError",
           "QueueFullError", "ServeRequest", "TokenEvent"]

DEFAULT_CACHE_MEMORY = 256 * 2**20  # bytes of keys and values the prefix cache may keep
DEFAULT_PREFILL_CHUNK = 256  # prompt tokens forwarded per engine step (then the running rows decode)


class Engine:
    """Continuous batching over one model (see the module docstring).

    max_rows: most rows (sum of n over running requests) decoded together.
    max_queue: most requests waiting for rows; `submit` raises `QueueFullError` beyond it.
    cache_memory: bytes of keys and values the prefix cache may keep (0: no prefix cache; None:
        `DEFAULT_CACHE_MEMORY` when the model's cache can share slots, else none).
    prefill_chunk: most prompt tokens forwarded per step, over all the prompts being prefilled;
        a longer prompt is prefilled over several steps, each followed by a decode step of the
        running rows.
    combiner: a `LogitsCombiner` (contrastive decoding, DExperts) every request is decoded with:
        its companions keep rows next to the model's (`companions.CompanionCaches`); no prefix
        cache then (ValueError for a `cache_memory` > 0).
    drafter: a `Drafter` (any registered one: model-free, Medusa heads, or draft models, whose
        caches count in the admission check) every request is decoded
        speculatively with, each request with its own copy, verified as `speculative` says (a
        `SpeculativeConfig`; default γ = 4, token verification):
        the draft / verify stage of speculation.py replaces the decode step. Not with a combiner.
    """

    def __init__(self, model, *, max_rows: int = 16, max_queue: int = 64, cache_memory: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, combiner: LogitsCombiner | None = None,
                 drafter: Drafter | None = None, speculative: SpeculativeConfig | None = None) -> None:
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk!r} must be an int >= 1 (prompt tokens per step)")
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows} must be >= 1")
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0")
        if cache_memory is not None and (isinstance(cache_memory, bool) or not isinstance(cache_memory, int)
                                         or cache_memory < 0):
            raise ValueError(f"cache_memory={cache_memory!r} must be an int >= 0 (bytes)")
        if drafter is not None and combiner is not None:
            raise ValueError(f"the {drafter.name} drafter cannot decode with a combiner ({type(combiner).__name__}): "
                             "speculation verifies the model's own logits, and the companions' caches would have "
                             "to take the drafts too; serve one or the other")
        if speculative is not None and drafter is None:
            raise ValueError("speculative= configures a drafter: give drafter= too")
        if combiner is not None and cache_memory:
            raise ValueError(f"--cache-memory {cache_memory}: the prefix cache indexes the model's keys and values "
                             "only, and the combiner's companion models need theirs too; use --cache-memory 0")
        self.model = model
        self.combiner = combiner
        self.companions = None if combiner is None else CompanionCaches(model, combiner)
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._cache = model.new_cache(1)
        self.prefix_cache = self._make_prefix_cache(0 if combiner is not None else cache_memory)
        self.stats = EngineStats()
        self.speculation = None if drafter is None else SpeculativeStage(
            model, self._cache, drafter, speculative or SpeculativeConfig(), self.stats)
        prefixes = PrefixCacheManager(self._cache, self.prefix_cache, self.stats, self.companions)
        self.scheduler = Scheduler(max_rows, prefill_chunk, max_queue, prefixes=prefixes, stats=self.stats)
        self.prefill = ChunkedPrefill(model, self._cache, prefixes, self.stats, prefill_chunk, self.companions,
                                      positions=1 if self.speculation is None else self.speculation.positions,
                                      draft_models=() if drafter is None else drafter.draft_models)
        self.runner = ModelRunner(model, self._cache, self.companions)
        self._inbox: queue.Queue[ServeRequest | None] = queue.Queue()  # submitted, not yet taken by the engine thread
        self._stopping = False
        self._dead: str | None = None  # why the engine thread ended, once it has
        self._thread = threading.Thread(target=self._run, name="metagen-engine", daemon=True)

    def _make_prefix_cache(self, cache_memory: int | None) -> PrefixCache | None:
        cache = self._cache
        can_share = isinstance(cache, PagedCache)
        if cache_memory == 0 or (cache_memory is None and not can_share):
            return None
        if not can_share:
            raise ValueError(f"--cache-memory: the prefix cache needs a cache whose slots can be shared (a "
                             f"PagedCache), and this model's cache ({type(cache).__name__}) is not one; use "
                             f"--cache-memory 0")
        budget = DEFAULT_CACHE_MEMORY if cache_memory is None else cache_memory
        return PrefixCache(budget // self.model.kv_bytes_per_token, cache.share, cache.release)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish: waiting and running requests end with an error event; joins the thread."""
        self._stopping = True
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """True while the engine thread runs."""
        return self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        """Requests submitted and not yet admitted to the batch."""
        return self.scheduler.queue_depth

    def submit(self, request: ServeRequest) -> None:
        """Queue `request`; QueueFullError when `max_queue` requests already wait, ValueError when
        its n exceeds max_rows (it could never be admitted)."""
        if request.params.n > self.max_rows:
            raise ValueError(f"n={request.params.n} is more than the server's --max-rows {self.max_rows}")
        if self.speculation is not None:
            self.speculation.check(request.params)
        if self._dead is not None:
            raise EngineStoppedError(self._dead)
        self.scheduler.reserve()
        self._inbox.put(request)

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        scheduler = self.scheduler
        reason = "the server is shutting down"
        try:
            while not self._stopping:
                block = not scheduler.running and not scheduler.waiting
                try:
                    while True:
                        item = self._inbox.get(block=block)
                        block = False
                        if item is None:
                            break
                        scheduler.add(item)
                except queue.Empty:
                    pass
                if self._stopping:
                    break
                self._admit()
                if scheduler.running and self.speculation is not None:
                    self._speculative_step()
                elif scheduler.running:
                    self._step()
        except BaseException as error:  # a bug in the loop itself: nobody may be left waiting
            reason = f"the engine stopped: {type(error).__name__}: {error}"
            raise
        finally:
            self._dead = reason
            while True:  # requests still queued get their answer too
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    scheduler.add(item)
            scheduler.finish_all(reason)

    def _admit(self) -> None:
        """This step's admission and prefill: the scheduler names the waiting requests that leave
        and those given rows; the new ones are set up (`_start`), then each forwards its share of
        `prefill_chunk` prompt tokens (`Scheduler.plan_prefill`, `_prefill`), and one whose prompt
        is all in joins the running batch. A request failing here fails alone."""
        scheduler = self.scheduler
        admission = scheduler.admit(time.monotonic())
        for request, event in admission.stopped:
            scheduler.finish(request, event)
        started = [request for request in admission.admitted
                   if request.status is not RequestStatus.WAITING or self._attempt(request, self._start)]
        for request, tokens in scheduler.plan_prefill(started):
            if tokens and self._attempt(request, self._prefill, tokens) and request.logits is not None:
                scheduler.start_running(request)

    def _attempt(self, request: EngineRequest, work, *args) -> bool:
        """work(request, *args); on an exception the request fails alone (`Scheduler.finish`: its
        event says why) and False is returned: one request must not stop the engine."""
        try:
            work(request, *args)
        except Exception as error:  # noqa: BLE001
            self.scheduler.finish(request, DoneEvent(f"{type(error).__name__}: {error}"))
            return False
        return True

    def _start(self, request: EngineRequest) -> None:
        """Set up an admitted request: its rows and its cached prefix (`ChunkedPrefill.start`)."""
        self.prefill.start(request, self.scheduler.rows_in_use())
        self.scheduler.start_prefill(request)

    def _prefill(self, request: EngineRequest, budget: int) -> None:
        """Forward the next (at most `budget`) tokens of the request's prompt
        (`ChunkedPrefill.prefill`); on the last piece its rows join the batch."""
        self.prefill.prefill(request, budget, batch_running=bool(self.scheduler.running))

    def _step(self) -> None:
        """One decode step, vLLM v1's schedule -> execute -> update: the scheduler names the running
        requests that leave and the rows of the others; each request chooses a token per row
        (`ModelRunner.sample`); `Scheduler.update_from_output` pushes them into its rows; one
        forward of the rows going on gives their next logits (`_forward`)."""
        scheduler = self.scheduler
        schedule = scheduler.decode(time.monotonic())
        for request, event in schedule.stopped:
            scheduler.finish(request, event)
        sampled, failed = self.runner.sample(schedule.decoding)
        for request, event in failed:
            scheduler.finish(request, event)
        kept_rows, next_tokens = scheduler.update_from_output(sampled)
        self._forward(kept_rows, next_tokens)

    def _speculative_step(self) -> None:
        """One step of the draft / verify stage (speculation.py): the scheduler names the running
        requests that leave; those that just joined draw their first tokens; the rows that ended
        leave (`Scheduler.settle`, `ModelRunner.select`); every running request drafts, one
        forward scores every row and each request verifies its own; the rows that ended leave."""
        scheduler, stage = self.scheduler, self.speculation
        schedule = scheduler.decode(time.monotonic())
        for request, event in schedule.stopped:
            scheduler.finish(request, event)
        failed = stage.first_tokens(schedule.decoding)
        for request, event in failed:
            scheduler.finish(request, event)
        gone = {id(request) for request, _ in failed}
        self.runner.select(scheduler.settle([(r, rows) for r, rows in schedule.decoding if id(r) not in gone]))
        if scheduler.running:
            try:
                verified, failed = stage.step(scheduler.running)
            except Exception as error:  # noqa: BLE001 - the forward failed: the batch is lost
                self._lose_batch(error)
                return
            for request, event in failed:
                scheduler.finish(request, event)
            self.runner.select(scheduler.settle(verified))
        self.stats.batch_rows = scheduler.rows_in_use()
        self.stats.running_requests = len(scheduler.running)

    def _lose_batch(self, error: Exception) -> None:
        """A failed forward loses the batch: every running request fails, the cache is emptied."""
        for request in list(self.scheduler.running):
            self.scheduler.finish(request, DoneEvent(f"{type(error).__name__}: {error}"))
        self.runner.reset()

    def _forward(self, kept_rows: list[int], next_tokens: list[int]) -> None:
        """Drop the cache rows that ended, then one decode forward of the rest (`ModelRunner`),
        counted. A failed forward loses the batch: every request in it fails."""
        running, stats = self.scheduler.running, self.stats
        self.runner.select(kept_rows)
        stats.batch_rows = len(kept_rows)
        stats.running_requests = len(running)
        if not running:
            return
        stats.steps += 1
        stats.step_rows += len(kept_rows)
        stats.max_batch_rows = max(stats.max_batch_rows, len(kept_rows))
        try:
            self.runner.forward(next_tokens, running)
        except Exception as error:  # noqa: BLE001 - the batch is lost: every request in it fails
            self._lose_batch(error)
