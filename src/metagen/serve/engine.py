"""The serving engine: one thread owns the model and one KV cache and runs continuous batching.

Requests join and leave the running batch at step boundaries. The cache's rows are grouped by
request, in admission order, so request r owns the contiguous rows `[start_r, start_r + k_r)`
and its logits are the slice `logits[start_r : start_r + k_r]` (a view, no copy). As in vLLM
v1, the scheduler (scheduler.py) decides and the engine runs; one step:

    _admit: scheduler.admit(now)             # waiting requests leaving; those given rows (FCFS)
        _start (new ones)                    # RowBatch.start; its cached prefix as its prompt row
        scheduler.plan_prefill(started)      # at most `prefill_chunk` prompt tokens (`prefill_plan`)
        _prefill, per prompt:                # each prompt prefilled alone (below)
            snapshot the running rows
            _forward_piece: cache.restore([its prompt row])   # a cached prefix, or its earlier pieces,
                                                              # or reset(1) for its first piece
                            out = model.forward(cache, [next piece of prompt])  # "last" (1, V) on the last piece
            last piece: _join: cache.restore(running + [prompt row] * n)   # page-table ints, no K/V copy
                               prefix_cache.insert(prompt_ids, prompt slots); lock it
                        -> RUNNING (scheduler.start_running)
            else:       prompt row = cache.snapshot(0); cache.restore(running)   # it goes on next step
    _step: scheduler.decode(now)             # running requests leaving; each other's rows
        _sample, for each request r (rows a..b):    # per-request sampling state
            processed = chain_r.process(logits[a:b])            # its own SamplingParams / constraint
            tokens    = chain_r.choose(processed, generator_r)  # its own torch.Generator
            chain_r.accept(tokens)
        records = token_records(rows of a group)   # batched log-softmax / top-k per (greedy, top-k) group
        update_from_output:
            batch_r.push(b, token, record)            # per row: the shared decoding core, a TokenEvent
            prefix_cache.insert(finished rows' prompt + output)     # before their rows leave
            batch_r.keep(its rows going on)           # its chain and rows (`RowBatch`)
        _forward: cache.select(rows going on, every request)      # finished / cancelled rows leave
                  logits = model.forward(cache, last tokens (B, 1))  # one decode forward for every row

A request that ends while the engine runs — finished, failed, cancelled, past its deadline —
goes through one exit, `_end`: out of the waiting list or the batch, its prompt unpinned,
counted, its `DoneEvent`. When the engine stops (`stop`, or a fault of the loop itself), `_run`'s
`finally` takes the other way out: it marks the engine dead (later submissions raise
`EngineStoppedError`), drains the queue and emits a `DoneEvent` with the reason to every waiting
and running request directly, without `_end` (nothing counted or unpinned).

Each request goes through exactly the steps `decoding.sample_loop.stream` takes alone: the same
prefill (1-row forwards of the prompt), the same set-up (`RowBatch.start`) and the same
generator draws in the same order (one `torch.Generator` per request, drawing for that request's
rows only), so a request's output does not depend on its batch companions except through the
floating-point rounding of a batched forward. Prefilling each prompt alone keeps its prefill
bit-identical to a run alone (when no prefix comes from the prefix cache and the prompt fits in
one chunk, below); a mixed prefill + decode forward would pad it.

Chunked prefill (as vLLM's chunked prefill and llama.cpp's n_batch): a step forwards at most
`prefill_chunk` prompt tokens (`metagen serve --prefill-chunk`, default 256), then the running
rows decode, so a long prompt delays each running stream by one chunk's forward per token
instead of its whole prefill (a 3,530-token prompt: worst gap 91-135 s whole, 7-8 s in pieces
of 256, on a loaded 2-core machine; BENCHMARKS.md, `benchmarks/prefill_stall.py`). Between
steps the partly prefilled prompt row waits as a snapshot (`EngineRequest.prompt_row`, holding
its slots). A prompt fed in pieces is the cached-prefix case below: the same keys, values and
logits as a whole prefill up to float rounding (tests: fp32 token for token), and bit-identical
for prompts up to one chunk.

Cost per step: one forward of B rows × 1 token plus the prefill forwards of at most
`prefill_chunk` prompt tokens (one per prompt touched) with two snapshots of the running rows'
page tables each; the per-request work is O(k_r · V) for the chain and the records.

Prefix cache (RadixAttention; `models/prefix_cache.py`): with `cache_memory` > 0 a radix tree
indexes the KV slots of prompts (at admission) and of finished rows (prompt + output) by their
token ids. A new prompt's row starts from the longest cached prefix (`KVCache.share`, page-table
ints) and only the rest is prefilled — at least its last token, whose logits start decoding; the
reused length is `ServeRequest.cached_tokens`. A running request locks its prompt's path; the
least recently used unlocked leaves are evicted once the tree holds more than
`cache_memory / model.kv_bytes_per_token` tokens. Reused keys and values are the ones a full prefill
computes up to float rounding (split vs whole prefill: < 4e-5 in logits for fp32 weights,
up to ~0.16 with bf16 activations, which can flip a greedy token whose top-2 margin is smaller).
Echo requests need logits at every prompt position: they take no cached prefix, each piece of
their prefill returns `(C, V)` logits that a `PromptScorer` turns into the records the response
returns (log-prob and top-k per token) before the next piece, so no `(T, V)` tensor of the whole
prompt exists (it was ~200 KB per prompt token at V = 49,152, twice over with its log-softmax).

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
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompt_scoring import PromptScorer
from metagen.decoding.records import TokenRecord, token_records
from metagen.models.prefix_cache import PrefixCache
from metagen.serve.requests import (DoneEvent, EngineStats, EngineStoppedError, QueueFullError, ServeRequest,
                                    TokenEvent)
from metagen.serve.scheduler import EngineRequest, RequestStatus, Scheduler, prefill_plan

__all__ = ["DEFAULT_CACHE_MEMORY", "DEFAULT_PREFILL_CHUNK", "DoneEvent", "Engine", "EngineStats", "EngineStoppedError",
           "QueueFullError", "ServeRequest", "TokenEvent", "model_forward", "prefill_plan"]

DEFAULT_CACHE_MEMORY = 256 * 2**20  # bytes of keys and values the prefix cache may keep
DEFAULT_PREFILL_CHUNK = 256  # prompt tokens forwarded per engine step (then the running rows decode)


@dataclass(eq=False)
class SampledRows:
    """What one decode step produced for one request: its cache rows, its processed logits
    `(k, V)`, the tokens chosen `(k,)` and their records (one per row)."""

    request: EngineRequest
    rows: range
    processed: torch.Tensor
    tokens: torch.Tensor
    records: list[TokenRecord] = field(default_factory=list)


class Engine:
    """Continuous batching over one model (see the module docstring).

    max_rows: most rows (sum of n over running requests) decoded together.
    max_queue: most requests waiting for rows; `submit` raises `QueueFullError` beyond it.
    cache_memory: bytes of keys and values the prefix cache may keep (0: no prefix cache; None:
        `DEFAULT_CACHE_MEMORY` when the model's cache can share slots, else none).
    prefill_chunk: most prompt tokens forwarded per step, over all the prompts being prefilled;
        a longer prompt is prefilled over several steps, each followed by a decode step of the
        running rows.
    """

    def __init__(self, model, *, max_rows: int = 16, max_queue: int = 64, cache_memory: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk!r} must be an int >= 1 (prompt tokens per step)")
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows} must be >= 1")
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0")
        if cache_memory is not None and (isinstance(cache_memory, bool) or not isinstance(cache_memory, int)
                                         or cache_memory < 0):
            raise ValueError(f"cache_memory={cache_memory!r} must be an int >= 0 (bytes)")
        self.model = model
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._cache = model.new_cache(1)
        self.prefix_cache = self._make_prefix_cache(cache_memory)
        self.stats = EngineStats()
        self.scheduler = Scheduler(max_rows, prefill_chunk)  # engine thread only
        self._waiting: queue.Queue[ServeRequest | None] = queue.Queue()
        self._waiting_count = 0
        self._lock = threading.Lock()  # guards _waiting_count against concurrent submits
        self._stopping = False
        self._dead: str | None = None  # why the engine thread ended, once it has
        self._thread = threading.Thread(target=self._run, name="metagen-engine", daemon=True)

    def _make_prefix_cache(self, cache_memory: int | None) -> PrefixCache | None:
        cache = self._cache
        can_share = self.model.paged_cache
        if cache_memory == 0 or (cache_memory is None and not can_share):
            return None
        if not can_share:
            raise ValueError(f"--cache-memory: the prefix cache needs the paged KV cache, and this model's cache "
                             f"({type(cache).__name__}) cannot share slots; use --cache-memory 0")
        budget = DEFAULT_CACHE_MEMORY if cache_memory is None else cache_memory
        return PrefixCache(budget // self.model.kv_bytes_per_token, cache.share, cache.release)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish: waiting and running requests end with an error event; joins the thread."""
        self._stopping = True
        self._waiting.put(None)
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """True while the engine thread runs."""
        return self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        """Requests submitted and not yet admitted to the batch."""
        return self._waiting_count

    def submit(self, request: ServeRequest) -> None:
        """Queue `request`; QueueFullError when `max_queue` requests already wait, ValueError when
        its n exceeds max_rows (it could never be admitted)."""
        if request.params.n > self.max_rows:
            raise ValueError(f"n={request.params.n} is more than the server's --max-rows {self.max_rows}")
        if self._dead is not None:
            raise EngineStoppedError(self._dead)
        with self._lock:
            if self._waiting_count >= self.max_queue:
                raise QueueFullError(f"{self._waiting_count} requests are waiting (--max-queue {self.max_queue})")
            self._waiting_count += 1
        self._waiting.put(request)

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        scheduler = self.scheduler
        reason = "the server is shutting down"
        try:
            while not self._stopping:
                block = not scheduler.running and not scheduler.waiting
                try:
                    while True:
                        item = self._waiting.get(block=block)
                        block = False
                        if item is None:
                            break
                        scheduler.add(item)
                except queue.Empty:
                    pass
                if self._stopping:
                    break
                self._admit()
                if scheduler.running:
                    self._step()
        except BaseException as error:  # a bug in the loop itself: nobody may be left waiting
            reason = f"the engine stopped: {type(error).__name__}: {error}"
            raise
        finally:
            self._dead = reason
            while True:  # requests still queued get their answer too
                try:
                    item = self._waiting.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    scheduler.add(item)
            for state in scheduler.waiting + scheduler.running:
                state.request.emit(DoneEvent(reason))
            scheduler.running = []

    def _admit(self) -> None:
        """This step's admission and prefill: the scheduler names the waiting requests that leave
        and those given rows; the new ones are set up (`_start`), then each forwards its share of
        `prefill_chunk` prompt tokens (`Scheduler.plan_prefill`), and one whose prompt is all in
        joins the running batch. A request failing here fails alone."""
        scheduler = self.scheduler
        admission = scheduler.admit(time.monotonic())
        for request, event in admission.stopped:
            self._end(request, event)
        started = [request for request in admission.admitted
                   if request.status is not RequestStatus.WAITING or self._attempt(request, self._start)]
        for request, tokens in scheduler.plan_prefill(started):
            if tokens and self._attempt(request, self._prefill, tokens) and request.logits is not None:
                self._dequeued()
                scheduler.start_running(request)

    def _attempt(self, request: EngineRequest, work, *args) -> bool:
        """work(request, *args); on an exception the request fails alone (`_end`: its event says
        why) and False is returned: one request must not stop the engine."""
        try:
            work(request, *args)
        except Exception as error:  # noqa: BLE001
            self._end(request, DoneEvent(f"{type(error).__name__}: {error}"))
            return False
        return True

    def _end(self, request: EngineRequest, event: DoneEvent) -> None:
        """`request` leaves the engine with `event`: out of the waiting list (its partial prompt
        row released) or out of the batch (its rows are dropped by the next `cache.select`); its
        prompt unpinned in the prefix cache; counted; told."""
        if request.status.queued:
            self._dequeued()
            self.scheduler.drop(request)
            if request.prompt_row is not None:
                self._cache.release(request.prompt_row)
                request.prompt_row = None
        if request.prefix_node is not None:
            self.prefix_cache.unlock(request.prefix_node)
            request.prefix_node = None
            self._evict()
        self.stats.count(event)
        request.status = RequestStatus(event.outcome)
        request.request.emit(event)

    def _dequeued(self) -> None:
        with self._lock:
            self._waiting_count -= 1

    def _start(self, request: EngineRequest) -> None:
        """Set up the request's rows (`RowBatch.start`: chain, rows, generator; a strategy run
        hands its own generator, serve/engine_generator.py) and its prompt row: the longest
        cached prefix of the prompt (a snapshot sharing its slots) or none."""
        model, params, prompt_ids, caller = self.model, request.params, request.prompt_ids, request.request
        batch = RowBatch.start(model, prompt_ids, params, healed=caller.healed, generator=caller.generator,
                               rows_in_use=self.scheduler.rows_in_use())  # its rows live in the engine's shared cache
        if caller.echo:
            check_batch_fits(model, 1, 0, positions=min(len(prompt_ids), self.prefill_chunk), what="echo rows")
            request.scorer = PromptScorer(prompt_ids, params.logprobs or 0)
        request.batch, caller.rows = batch, batch.rows
        request.status = RequestStatus.PREFILLING
        prefixes, reused = self.prefix_cache, 0
        if prefixes is not None and not caller.echo:  # at least the last token is computed
            found = prefixes.match(prompt_ids[:-1])
            reused = found.length
            if reused:
                request.prompt_row = self._cache.share(found.slots)
        caller.cached_tokens = request.prefilled = reused
        if reused:
            self.stats.prefix_hits += 1
            self.stats.prefix_tokens_reused += reused

    def _prefill(self, request: EngineRequest, budget: int) -> None:
        """Forward the next (at most `budget`) tokens of the request's prompt on its own prompt
        row (`_forward_piece`), the running rows set aside as snapshots; once the whole prompt is
        in, its n rows join the end of the batch (`_join`) and `request.logits` is set."""
        prompt_ids, cache = request.prompt_ids, self._cache
        begin = request.prefilled
        end = min(len(prompt_ids), begin + budget)
        last = end == len(prompt_ids)
        running = [cache.snapshot(row) for row in range(cache.batch_size)] if self.scheduler.running else []
        try:
            logits, prompt_row = self._forward_piece(request, begin, end, last)
            if last:
                self._join(request, running, prompt_row)
            else:
                cache.restore(running)
                request.prompt_row = prompt_row
        except Exception:
            cache.restore(running)  # the running rows are untouched by a failed prefill
            raise
        finally:
            for snapshot in running:
                cache.release(snapshot)
        request.prefilled = end
        caller = request.request
        if caller.echo:
            request.scorer.add(logits[0])  # (C, V): records of the tokens these positions predict
        if last:
            if caller.echo:
                logits = logits[0, -1:].clone()  # (1, V), no view of a (C, V) chunk
                caller.prompt_records, request.scorer = request.scorer.records, None
            request.logits = logits.expand(request.params.n, -1)  # (n, V): every row starts from the prompt
            self.stats.prompt_tokens += len(prompt_ids)

    def _forward_piece(self, request: EngineRequest, begin: int, end: int, last: bool):
        """Prompt tokens [begin, end) forwarded on the request's prompt row alone (its earlier
        pieces or its cached prefix, else an empty row): `model.prefill`'s computation, in pieces.
        Returns the logits (`(1, C, V)` for echo, `(1, V)` on the last piece, else None) and the
        prompt row's snapshot; the cache is left holding that row only."""
        cache = self._cache
        if request.prompt_row is not None:
            cache.restore([request.prompt_row])
            cache.release(request.prompt_row)
            request.prompt_row = None
        else:
            cache.reset(1)
        out = self.model.forward(cache, [list(request.prompt_ids[begin:end])],
                                 logits="all" if request.request.echo else "last" if last else "none")
        return out.logits, cache.snapshot(0)

    def _join(self, request: EngineRequest, running: list, prompt_row) -> None:
        """The running rows back, then the prompt row n times (page-table ints, no K/V copy); the
        prompt indexed in the prefix cache and locked while the request runs (unless a
        sliding-window cache already released its oldest positions)."""
        cache, prefixes = self._cache, self.prefix_cache
        cache.restore(running + [prompt_row] * request.params.n)
        if prefixes is not None and not prompt_row.start:
            request.prefix_node = prefixes.insert(request.prompt_ids, prompt_row.slots)
            prefixes.lock(request.prefix_node)
            self._evict()
        cache.release(prompt_row)

    def _step(self) -> None:
        """One decode step, vLLM v1's schedule -> execute -> update: the scheduler names the running
        requests that leave and the rows of the others; each request chooses a token per row
        (`_sample`); `update_from_output` pushes them into its rows; one forward of the rows going
        on gives their next logits (`_forward`)."""
        schedule = self.scheduler.decode(time.monotonic())
        for request, event in schedule.stopped:
            self._end(request, event)
        sampled = self._sample(schedule.decoding)
        kept_rows, next_tokens = self.update_from_output(sampled)
        self._forward(kept_rows, next_tokens)

    def _sample(self, decoding: list[tuple[EngineRequest, range]]) -> list[SampledRows]:
        """Per request, its chain on its rows' logits with its own generator
        (`sample_loop.stream`'s process -> choose -> accept; a failure ends that request alone),
        then the records of every chosen token (`_records`)."""
        sampled = []
        for request, rows in decoding:
            chain = request.batch.chain
            try:
                processed = chain.process(request.logits)  # (k, V)
                tokens = chain.choose(processed, request.batch.generator)  # (k,)
                chain.accept(tokens)
            except Exception as error:  # noqa: BLE001 - fail this request only
                self._end(request, DoneEvent(f"{type(error).__name__}: {error}"))
                continue
            sampled.append(SampledRows(request, rows, processed, tokens))
        _records(sampled)
        return sampled

    def update_from_output(self, sampled: list[SampledRows]) -> tuple[list[int], list[int]]:
        """Apply one step's output to the requests: each row takes its token (`RowBatch.push`:
        stop rules, text, records; a `TokenEvent` each); the rows that ended are indexed in the
        prefix cache and leave their request's `RowBatch`; a request whose rows all ended
        finishes. Returns the cache rows going on and their last tokens; the scheduler's running
        list becomes the requests going on."""
        kept_rows: list[int] = []
        next_tokens: list[int] = []
        running: list[EngineRequest] = []
        for step in sampled:
            request, rows, batch = step.request, step.rows, step.request.batch
            chosen = step.tokens.tolist()
            keep = []
            for b, (index, token) in enumerate(zip(batch.active, chosen)):
                text = batch.push(b, token, step.records[b])
                completion = batch.rows[index].completion
                if completion.finish_reason is None:
                    keep.append(b)
                request.request.emit(TokenEvent(index, text, token, step.records[b], completion.finish_reason,
                                                completion.stop_reason))
            self.stats.generated_tokens += len(chosen)
            if len(keep) < len(rows):
                self._cache_finished(request, rows, keep)
            if not keep:
                self._end(request, DoneEvent())
                continue
            batch.keep(keep)  # its chain and rows; the shared cache's rows are selected in `_forward`
            kept_rows += [rows[b] for b in keep]
            next_tokens += [chosen[b] for b in keep]
            running.append(request)
        self.scheduler.running = running
        return kept_rows, next_tokens

    def _forward(self, kept_rows: list[int], next_tokens: list[int]) -> None:
        """Drop the cache rows that ended, then one decode forward of the rest; each running
        request's logits are its slice (a view). A failed forward loses the batch: every request
        in it fails."""
        cache, running, stats = self._cache, self.scheduler.running, self.stats
        if len(kept_rows) < cache.batch_size:
            cache.select(kept_rows)
        stats.batch_rows = len(kept_rows)
        stats.running_requests = len(running)
        if not running:
            return
        stats.steps += 1
        stats.step_rows += len(kept_rows)
        stats.max_batch_rows = max(stats.max_batch_rows, len(kept_rows))
        try:
            out = model_forward(self.model, cache, next_tokens)
        except Exception as error:  # noqa: BLE001 - the batch is lost: every request in it fails
            for request in running:
                self._end(request, DoneEvent(f"{type(error).__name__}: {error}"))
            self.scheduler.running = []
            cache.reset(0)
            return
        start = 0
        for request in running:
            k = request.live_rows
            request.logits = out.logits[start:start + k]  # (k, V) view
            start += k

    def _cache_finished(self, request: EngineRequest, rows: range, keep: list[int]) -> None:
        """Index the finished rows' cached tokens (prompt + output but the last token, which was
        never forwarded) in the prefix cache, before their rows leave the batch."""
        prefixes = self.prefix_cache
        if prefixes is None:
            return
        cache, kept, batch = self._cache, set(keep), request.batch
        for b, index in enumerate(batch.active):
            if b in kept or cache.released(rows[b]):  # a sliding window released its oldest positions
                continue
            slots = cache.slots(rows[b])
            tokens = (request.prompt_ids + batch.rows[index].completion.token_ids)[:slots.size]
            prefixes.insert(tokens, slots)
        self._evict()

    def _evict(self) -> None:
        self.stats.prefix_tokens_evicted += self.prefix_cache.evict()
        self.stats.prefix_tokens_cached = self.prefix_cache.size


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
