"""What requests hold of the engine's KV cache between steps: their cached prefixes (locked in the
prefix cache while they run) and their partly prefilled prompt rows — vLLM v1's KVCacheManager,
over slots instead of blocks.

The prefix cache (RadixAttention; `models/prefix_cache.py`) is a radix tree indexing the KV
slots of prompts (at admission) and of finished rows (prompt + output) by their token ids:

    match(request)           a new prompt's longest cached prefix as its prompt row (`KVCache.share`,
                             page-table ints); at least its last token is left to prefill
    hold(request, row)       its whole prompt indexed and its path locked while it runs
    cache_finished(...)      finished rows' prompt + output indexed before their rows leave the batch
    free(request)            its prompt row (and its companions' prompt rows) released, its path
                             unlocked (`Scheduler.finish`, the one way out of the engine)

After each insert or unlock the least recently used unlocked leaves are evicted once the tree
holds more than its capacity (`cache_memory / model.kv_bytes_per_token` tokens); a locked path is never
evicted, as running rows use its slots anyway. Cost: O(prompt) per match, insert and lock, plus
the eviction's O(leaves log leaves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metagen.models.cache import RowSnapshot
    from metagen.serve.companions import CompanionCaches
    from metagen.models.prefix_cache import PrefixCache
    from metagen.serve.requests import EngineStats
    from metagen.serve.request_state import EngineRequest


class PrefixCacheManager:
    """The engine's prefix cache (None: no prefix cache) and the slots its requests hold in
    `cache` (the engine's shared `KVCache`; engine thread only), and in the caches of the
    `companions` of a server-wide combiner (a `CompanionCaches`, or None). Writes the prefix
    counters of `stats`."""

    def __init__(self, cache, prefixes: PrefixCache | None, stats: EngineStats,
                 companions: CompanionCaches | None = None) -> None:
        self.cache, self.prefixes, self.stats, self.companions = cache, prefixes, stats, companions

    def match(self, request: EngineRequest) -> None:
        """The longest cached prefix of the request's prompt but its last token (whose logits
        start decoding) becomes its prompt row, a snapshot sharing the prefix's slots; echo
        requests take none (they need logits at every prompt position). Sets `prefilled` and the
        caller's `cached_tokens` to its length (0 without one)."""
        caller, reused = request.request, 0
        if self.prefixes is not None and not caller.echo:
            found = self.prefixes.match(request.prompt_ids[:-1])
            reused = found.length
            if reused:
                request.prompt_row = self.cache.share(found.slots)
        caller.cached_tokens = request.prefilled = reused
        if reused:
            self.stats.prefix_hits += 1
            self.stats.prefix_tokens_reused += reused

    def hold(self, request: EngineRequest, prompt_row: RowSnapshot) -> None:
        """The request's whole prompt (`prompt_row`, just prefilled) indexed in the prefix cache
        and locked while the request runs — unless a sliding-window cache already released its
        oldest positions."""
        if self.prefixes is not None and not prompt_row.start:
            request.prefix_node = self.prefixes.insert(request.prompt_ids, prompt_row.slots)
            self.prefixes.lock(request.prefix_node)
            self._evict()

    def cache_finished(self, request: EngineRequest, rows: range, keep: list[int]) -> None:
        """Index the finished rows' cached tokens (prompt + output but the last token, which was
        never forwarded; a speculative row's draft tokens past where it stopped are left out) in
        the prefix cache, before their rows leave the batch. `rows`: the
        request's cache rows this step; `keep`: the indices (into its live rows) going on."""
        if self.prefixes is None:
            return
        cache, kept, batch = self.cache, set(keep), request.batch
        for b, index in enumerate(batch.active):
            if b in kept or cache.released(rows[b]):  # a sliding window released its oldest positions
                continue
            slots = cache.slots(rows[b])
            tokens = (request.prompt_ids + batch.rows[index].completion.token_ids)[:slots.size]
            self.prefixes.insert(tokens, slots[:len(tokens)])  # a speculative row may hold draft tokens past its stop
        self._evict()

    def free(self, request: EngineRequest) -> None:
        """Everything the request holds between steps let go: its partly prefilled prompt row
        released (the companions' too), its prompt's path unlocked (and what is now over capacity
        evicted). Its rows in the running batch, if any, are dropped by the next `cache.select`."""
        if self.companions is not None:
            self.companions.release(request)
        if request.prompt_row is not None:
            self.cache.release(request.prompt_row)
            request.prompt_row = None
        if request.prefix_node is not None:
            self.prefixes.unlock(request.prefix_node)
            request.prefix_node = None
            self._evict()

    def _evict(self) -> None:
        self.stats.prefix_tokens_evicted += self.prefixes.evict()
        self.stats.prefix_tokens_cached = self.prefixes.size
