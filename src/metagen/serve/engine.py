"""The serving engine: one thread owns the model and one KV cache and runs continuous batching.

Requests join and leave the running batch at step boundaries. The cache's rows are grouped by
request, in admission order, so request r owns the contiguous rows `[start_r, start_r + k_r)`
and its logits are the slice `logits[start_r : start_r + k_r]` (a view, no copy). One step:

    admit waiting requests while rows are free, at most `prefill_chunk` prompt tokens in all
    (split by `prefill_plan`: a short prompt is not held up behind a long one):
        snapshot the running rows                           # each prompt prefilled alone (below)
        cache.restore([its prompt row])                     # a cached prefix, or its earlier pieces,
                                                            # or reset(1) for its first piece
        out = model.forward(cache, [next piece of prompt])  # "none", "last" (1, V) on the last piece
        last piece: cache.restore(running + [prompt row] * n)   # page-table ints, no K/V copy
                    prefix_cache.insert(prompt_ids, prompt slots); lock it
        else:       prompt row = cache.snapshot(0); cache.restore(running)   # it goes on next step
    for each request r (rows a..b):                         # per-request sampling state
        processed = chain_r.process(logits[a:b])            # its own SamplingParams / constraint
        tokens    = chain_r.choose(processed, generator_r)  # its own torch.Generator
        chain_r.accept(tokens)
    records = token_records(all rows at once)               # one batched log-softmax / top-k
    batch_r.push(b, token, record)                          # per row: the shared decoding core
    prefix_cache.insert(finished rows' prompt + output)     # before their rows leave
    batch_r.keep(its rows going on)                         # its chain and rows (`RowBatch`)
    cache.select(rows going on, every request)              # finished / cancelled rows leave
    logits = model.forward(cache, last tokens (B, 1))       # one decode forward for every row

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
steps the partly prefilled prompt row waits as a snapshot (`ServeRequest.prompt_row`, holding
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
`cache_memory / bytes_per_token` tokens. Reused keys and values are the ones a full prefill
computes up to float rounding (split vs whole prefill: < 4e-5 in logits for fp32 weights,
up to ~0.16 with bf16 activations, which can flip a greedy token whose top-2 margin is smaller).
Echo requests need logits at every prompt position: they take no cached prefix, each piece of
their prefill returns `(C, V)` logits that a `PromptScorer` turns into the records the response
returns (log-prob and top-k per token) before the next piece, so no `(T, V)` tensor of the whole
prompt exists (it was ~200 KB per prompt token at V = 49,152, twice over with its log-softmax).

Thread model: `submit` (any thread) puts a `ServeRequest` in a bounded queue; the engine thread
is the only one touching the model, the cache, the chains and the rows. Events go back through
`ServeRequest.emit`, a callback the caller provides (the HTTP layer hands them to its event
loop). `cancel()` from any thread marks a request; its rows leave at the next step boundary.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompt_scoring import PromptScorer
from metagen.decoding.records import TokenRecord, token_records
from metagen.models.prefix_cache import PrefixCache
from metagen.serve.requests import (DoneEvent, EngineStats, EngineStoppedError, QueueFullError, ServeRequest,
                                    TokenEvent)

__all__ = ["DEFAULT_CACHE_MEMORY", "DEFAULT_PREFILL_CHUNK", "DoneEvent", "Engine", "EngineStats", "EngineStoppedError",
           "QueueFullError", "ServeRequest", "TokenEvent", "bytes_per_token", "model_forward"]

DEFAULT_CACHE_MEMORY = 256 * 2**20  # bytes of keys and values the prefix cache may keep
DEFAULT_PREFILL_CHUNK = 256  # prompt tokens forwarded per engine step (then the running rows decode)


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
        self._waiting: queue.Queue[ServeRequest | None] = queue.Queue()
        self._waiting_count = 0
        self._lock = threading.Lock()  # guards _waiting_count against concurrent submits
        self._running: list[ServeRequest] = []
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
        self.bytes_per_token = bytes_per_token(cache)
        return PrefixCache(budget // self.bytes_per_token, cache.share, cache.release)

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
        pending: list[ServeRequest] = []  # taken from the queue, waiting for rows
        reason = "the server is shutting down"
        try:
            while not self._stopping:
                block = not self._running and not pending
                try:
                    while True:
                        item = self._waiting.get(block=block)
                        block = False
                        if item is None:
                            break
                        pending.append(item)
                except queue.Empty:
                    pass
                if self._stopping:
                    break
                pending = self._admit(pending)
                if self._running:
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
                    pending.append(item)
            for request in pending + self._running:
                request.emit(DoneEvent(reason))
            self._running = []

    def _rows_in_use(self) -> int:
        return sum(len(request.batch.active) for request in self._running)

    def _admit(self, pending: list[ServeRequest]) -> list[ServeRequest]:
        """Prefill at most `prefill_chunk` prompt tokens of the pending requests whose rows fit,
        split by `prefill_plan` (a short prompt behind a long one starts within a step; rows are
        still given first come, first served: a request whose rows do not fit holds back the ones
        behind it); returns those still waiting."""
        still, ready, failed = [], [], set()
        now = time.monotonic()
        for request in pending:
            stopped = request.stopped(now)
            if stopped is not None:
                self._dequeued()
                self._drop_prefill(request)
                self._count_stop(stopped)
                request.emit(stopped)
            elif still or self._rows_in_use() + sum(r.params.n for r in ready) + request.params.n > self.max_rows:
                still.append(request)  # no overtaking for rows
            else:
                ready.append(request)
        for request in ready:
            if request.batch is None and not self._attempt(request, self._start):  # its cached prefix, its rows
                failed.add(id(request))
        ready = [request for request in ready if id(request) not in failed]
        plan = prefill_plan([len(request.prompt_ids) - request.prefilled for request in ready], self.prefill_chunk)
        for request, tokens in zip(ready, plan):
            if tokens and not self._attempt(request, lambda request: self._prefill(request, tokens)):
                continue
            if request.logits is None:  # part of its prompt is still to come
                still.append(request)
                continue
            self._dequeued()
            self._running.append(request)
        order = {id(request): number for number, request in enumerate(pending)}
        return sorted(still, key=lambda request: order[id(request)])

    def _attempt(self, request: ServeRequest, work) -> bool:
        """work(request); on an exception the request fails alone (its event says why, its partial
        prompt row is released) and False is returned: one request must not stop the engine."""
        try:
            work(request)
        except Exception as error:  # noqa: BLE001
            self._dequeued()
            self._drop_prefill(request)
            self.stats.requests_failed += 1
            self._leave(request)
            request.emit(DoneEvent(f"{type(error).__name__}: {error}"))
            return False
        return True

    def _count_stop(self, event: DoneEvent) -> None:
        if event.timed_out:
            self.stats.requests_timed_out += 1
        else:
            self.stats.requests_cancelled += 1

    def _dequeued(self) -> None:
        with self._lock:
            self._waiting_count -= 1

    def _start(self, request: ServeRequest) -> None:
        """Set up the request's rows (`RowBatch.start`: chain, rows, generator; a strategy run
        hands its own generator, serve/engine_generator.py) and its prompt row: the longest
        cached prefix of the prompt (a snapshot sharing its slots) or none."""
        model, params, prompt_ids = self.model, request.params, request.prompt_ids
        batch = RowBatch.start(model, prompt_ids, params, healed=request.healed, generator=request.generator,
                               rows_in_use=self._rows_in_use())  # its rows live in the engine's shared cache
        if request.echo:
            check_batch_fits(model, 1, 0, positions=min(len(prompt_ids), self.prefill_chunk), what="echo rows")
            request.scorer = PromptScorer(prompt_ids, params.logprobs or 0)
        request.batch, request.rows = batch, batch.rows
        prefixes, reused = self.prefix_cache, 0
        if prefixes is not None and not request.echo:  # at least the last token is computed
            found = prefixes.match(prompt_ids[:-1])
            reused = found.length
            if reused:
                request.prompt_row = self._cache.share(found.slots)
        request.cached_tokens = request.prefilled = reused
        if reused:
            self.stats.prefix_hits += 1
            self.stats.prefix_tokens_reused += reused

    def _prefill(self, request: ServeRequest, budget: int) -> int:
        """Forward the next (at most `budget`) tokens of the request's prompt on its own prompt
        row; once the whole prompt is in, add its n rows (the prompt row shared n times) at the end
        of the batch and set `request.logits`. Returns the tokens forwarded."""
        model, prompt_ids = self.model, request.prompt_ids
        if request.batch is None:  # its first piece
            self._start(request)
        begin = request.prefilled
        end = min(len(prompt_ids), begin + budget)
        last = end == len(prompt_ids)
        cache, prefixes = self._cache, self.prefix_cache
        running = [cache.snapshot(row) for row in range(cache.batch_size)] if self._running else []
        try:
            if request.prompt_row is not None:
                cache.restore([request.prompt_row])
                cache.release(request.prompt_row)
                request.prompt_row = None
            else:
                cache.reset(1)
            out = model.forward(cache, [list(prompt_ids[begin:end])],  # `model.prefill`'s computation, in pieces
                                logits="all" if request.echo else "last" if last else "none")
            prompt_row = cache.snapshot(0)
            if not last:
                cache.restore(running)
                request.prompt_row = prompt_row
            else:
                cache.restore(running + [prompt_row] * request.params.n)
                if prefixes is not None and not prompt_row.start:  # later requests reuse this prompt (unless
                    # a sliding-window cache already released its oldest positions)
                    request.prefix_node = prefixes.insert(prompt_ids, prompt_row.slots)
                    prefixes.lock(request.prefix_node)
                    self._evict()
                cache.release(prompt_row)
        except Exception:
            cache.restore(running)  # the running rows are untouched by a failed prefill
            raise
        finally:
            for snapshot in running:
                cache.release(snapshot)
        request.prefilled = end
        if request.echo:
            request.scorer.add(out.logits[0])  # (C, V): records of the tokens these positions predict
        if last:
            logits = out.logits[0, -1:].clone() if request.echo else out.logits  # (1, V), no view of a (C, V) chunk
            if request.echo:
                request.prompt_records, request.scorer = request.scorer.records, None
            request.logits = logits.expand(request.params.n, -1)  # (n, V): every row starts from the prompt
            self.stats.prompt_tokens += len(prompt_ids)
        return end - begin

    def _drop_prefill(self, request: ServeRequest) -> None:
        """Release the prompt row of a request leaving before its prefill ended."""
        if request.prompt_row is not None:
            self._cache.release(request.prompt_row)
            request.prompt_row = None

    def _step(self) -> None:
        """Choose one token for every running row, drop the rows that ended, forward the rest."""
        now = time.monotonic()
        chosen: list[tuple[ServeRequest, range, torch.Tensor, torch.Tensor]] = []
        start = 0
        for request in self._running:  # 1. per request: its chain on its rows, its generator
            k = len(request.batch.active)
            rows = range(start, start + k)
            start += k
            stopped = request.stopped(now)
            if stopped is not None:
                self._count_stop(stopped)
                self._leave(request)
                request.emit(stopped)
                continue
            try:
                processed, tokens = self._choose(request)
            except Exception as error:  # noqa: BLE001 - fail this request only
                self.stats.requests_failed += 1
                self._leave(request)
                request.emit(DoneEvent(f"{type(error).__name__}: {error}"))
                continue
            chosen.append((request, rows, processed, tokens))
        records = self._records(chosen)  # 2. the records of every chosen token, batched
        kept_rows: list[int] = []  # cache rows that go on
        next_tokens: list[int] = []
        still_running: list[ServeRequest] = []
        offset = 0
        for request, rows, _, tokens in chosen:  # 3. per row: the shared core's Row, events
            k = len(rows)
            keep, chosen_ids = self._push(request, tokens, records[offset:offset + k])
            offset += k
            if len(keep) < k:
                self._cache_finished(request, rows, keep)
            if not keep:
                self.stats.requests_finished += 1
                self._leave(request)
                request.emit(DoneEvent())
                continue
            request.batch.keep(keep)  # its chain and rows; the shared cache's rows are selected below
            kept_rows += [rows[b] for b in keep]
            next_tokens += [chosen_ids[b] for b in keep]
            still_running.append(request)
        self._running = still_running
        cache = self._cache
        if len(kept_rows) < cache.batch_size:
            cache.select(kept_rows)
        self.stats.batch_rows = len(kept_rows)
        self.stats.running_requests = len(still_running)
        if not still_running:
            return
        self.stats.steps += 1
        self.stats.step_rows += len(kept_rows)
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(kept_rows))
        try:
            out = model_forward(self.model, cache, next_tokens)
        except Exception as error:  # noqa: BLE001 - the batch is lost: every request in it fails
            for request in still_running:
                self.stats.requests_failed += 1
                self._leave(request)
                request.emit(DoneEvent(f"{type(error).__name__}: {error}"))
            self._running = []
            cache.reset(0)
            return
        start = 0
        for request in still_running:
            k = len(request.batch.active)
            request.logits = out.logits[start:start + k]  # (k, V) view
            start += k

    def _cache_finished(self, request: ServeRequest, rows: range, keep: list[int]) -> None:
        """Index the finished rows' cached tokens (prompt + output but the last token, which was
        never forwarded) in the prefix cache, before their rows leave the batch."""
        prefixes = self.prefix_cache
        if prefixes is None:
            return
        cache, kept = self._cache, set(keep)
        for b, index in enumerate(request.batch.active):
            if b in kept or cache.released(rows[b]):  # a sliding window released its oldest positions
                continue
            slots = cache.slots(rows[b])
            tokens = (request.prompt_ids + request.rows[index].completion.token_ids)[:slots.size]
            prefixes.insert(tokens, slots)
        self._evict()

    def _leave(self, request: ServeRequest) -> None:
        """The request's rows are leaving the batch: unpin its prompt in the prefix cache."""
        if request.prefix_node is not None:
            self.prefix_cache.unlock(request.prefix_node)
            request.prefix_node = None
            self._evict()

    def _evict(self) -> None:
        self.stats.prefix_tokens_evicted += self.prefix_cache.evict()
        self.stats.prefix_tokens_cached = self.prefix_cache.size

    @staticmethod
    def _choose(request: ServeRequest) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's processed logits `(k, V)` and chosen tokens `(k,)` for its rows, its
        processors advanced (`sample_loop.stream`'s process -> choose -> accept)."""
        chain = request.batch.chain
        processed = chain.process(request.logits)
        tokens = chain.choose(processed, request.batch.generator)
        chain.accept(tokens)
        return processed, tokens

    @staticmethod
    def _records(chosen: list[tuple[ServeRequest, range, torch.Tensor, torch.Tensor]]) -> list[TokenRecord]:
        """`token_records` of every row of every request in one batched call (row-wise math, so
        the same values as one call per request): greedy rows get sampled log-prob 0 (a point
        mass) and each row keeps its own request's number of top log-probs."""
        if not chosen:
            return []
        num_top = max(request.params.logprobs or 0 for request, *_ in chosen)
        logits = torch.cat([request.logits for request, *_ in chosen])  # (B, V)
        processed = torch.cat([processed for _, _, processed, _ in chosen])  # (B, V)
        tokens = torch.cat([tokens for *_, tokens in chosen])  # (B,)
        records = token_records(logits, tokens, processed, num_top)
        offset = 0
        for request, rows, _, _ in chosen:
            own_top = request.params.logprobs or 0
            if request.params.greedy or own_top != num_top:
                for b in range(offset, offset + len(rows)):
                    record = records[b]
                    top = None if not own_top else dict(list(record.top.items())[:own_top])
                    records[b] = record._replace(sampled=0.0 if request.params.greedy else record.sampled, top=top)
            offset += len(rows)
        return records

    def _push(self, request: ServeRequest, tokens: torch.Tensor, records: list[TokenRecord]) -> tuple[list[int], list[int]]:
        """Push each row's token into its `Row` and emit it; returns the positions of the rows that
        go on, and the chosen ids."""
        batch = request.batch
        chosen = tokens.tolist()
        keep = []
        for b, (index, token) in enumerate(zip(batch.active, chosen)):
            text = batch.push(b, token, records[b])
            finish = batch.rows[index].completion.finish_reason
            if finish is None:
                keep.append(b)
            request.emit(TokenEvent(index, text, token, records[b], finish))
        self.stats.generated_tokens += len(chosen)
        return keep, chosen


def bytes_per_token(cache) -> int:
    """Bytes of keys and values one cached token takes: layers · 2 · kv_heads · head_dim · itemsize
    (plus the int8 scales: `KVCache.bytes_per_token`)."""
    return cache.bytes_per_token


def model_forward(model, cache, tokens: Sequence[int]):
    """One decode forward: `tokens[b]` appended to row b; logits `(B, V)`."""
    return model.forward(cache, torch.tensor(tokens, dtype=torch.long)[:, None])
