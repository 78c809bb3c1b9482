"""Chunked prefill: a request's set-up and its prompt forwarded on its own prompt row, a piece per
engine step, until its n rows join the running batch.

As vLLM's chunked prefill and llama.cpp's n_batch, a step forwards at most `prefill_chunk` prompt
tokens (`metagen serve --prefill-chunk`, default 256; the scheduler's `prefill_plan` shares them
among the prompts), then the running rows decode, so a long prompt delays each running stream by
one chunk's forward per token instead of its whole prefill (a 3,530-token prompt: worst gap
91-135 s whole, 7-8 s in pieces of 256, on a loaded 2-core machine; BENCHMARKS.md,
`benchmarks/prefill_stall.py`). One piece:

    snapshot the running rows
    cache.restore([its prompt row])      # a cached prefix, or its earlier pieces, or reset(1) for its first piece
    out = model.forward(cache, [next piece of prompt])  # "last" (1, V) on the last piece, "all" for echo
    last piece: cache.restore(running + [prompt row] * n)    # page-table ints, no K/V copy
                prompt indexed and locked in the prefix cache (`PrefixCacheManager.hold`)
    else:       prompt row = cache.snapshot(0); cache.restore(running)    # it goes on next step

Each prompt is prefilled alone, as `decoding.sample_loop.stream` prefills it (a mixed prefill +
decode forward would pad it). Between steps the partly prefilled prompt row waits as a snapshot
(`EngineRequest.prompt_row`, holding its slots). A prompt fed in pieces is the cached-prefix
case: the same keys, values and logits as a whole prefill up to float rounding (tests: fp32 token
for token), and bit-identical for prompts up to one chunk.

Echo requests need logits at every prompt position: they take no cached prefix, and each piece
returns `(C, V)` logits that a `PromptScorer` turns into the records the response returns
(log-prob and top-k per token) before the next piece, so no `(T, V)` tensor of the whole prompt
exists (it was ~200 KB per prompt token at V = 49,152, twice over with its log-softmax).

With a server-wide combiner (companions.py) each piece is forwarded on the request's prompt row of
every companion cache too, first, and joined into its n rows with the model's.

Cost per piece: the forward of its C tokens (per model), plus two snapshots of the running rows'
page tables (per cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metagen.decoding.batch import RowBatch
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompt_scoring import PromptScorer

if TYPE_CHECKING:
    from metagen.serve.companions import CompanionCaches
    from metagen.serve.prefix_manager import PrefixCacheManager
    from metagen.serve.requests import EngineStats
    from metagen.serve.request_state import EngineRequest


class ChunkedPrefill:
    """Set-up and prefill of admitted requests over `model` and the engine's shared `cache`
    (engine thread only); `prefixes` gives and takes their cached prefixes, `stats` counts their
    prompt tokens; `companions` (a `CompanionCaches`, or None) are prefilled with them;
    `positions`: tokens a row feeds per decode step at most (1 + a draft), for the admission check;
    `draft_models`: the drafter's models, each keeping a cache of every request's rows (counted too)."""

    def __init__(self, model, cache, prefixes: PrefixCacheManager, stats: EngineStats, prefill_chunk: int,
                 companions: CompanionCaches | None = None, positions: int = 1, draft_models: tuple = ()) -> None:
        self.model, self.cache, self.prefixes, self.stats = model, cache, prefixes, stats
        self.prefill_chunk, self.companions, self.positions = prefill_chunk, companions, positions
        self.draft_models = tuple(draft_models)
        self.combiner = None if companions is None else companions.combiner

    def start(self, request: EngineRequest, rows_in_use: int) -> None:
        """Set up the request's rows (`RowBatch.start`: chain, rows, generator; a strategy run
        hands its own generator, serve/engine_generator.py) and its prompt row: the longest
        cached prefix of the prompt (`PrefixCacheManager.match`) or none. `rows_in_use`: the
        running batch's rows, which share the cache with the request's."""
        model, params, prompt_ids, caller = self.model, request.params, request.prompt_ids, request.request
        batch = RowBatch.start(model, prompt_ids, params, healed=caller.healed, generator=caller.generator,
                               rows_in_use=rows_in_use, combiner=self.combiner, positions=self.positions,
                               draft_models=self.draft_models,
                               vocabulary_checked=True)  # its rows live in the engine's caches (CompanionCaches)
        if caller.echo:
            check_batch_fits(model, 1, 0, positions=min(len(prompt_ids), self.prefill_chunk), what="echo rows")
            request.scorer = PromptScorer(prompt_ids, params.logprobs or 0)
        request.batch, caller.rows = batch, batch.rows
        self.prefixes.match(request)

    def prefill(self, request: EngineRequest, budget: int, batch_running: bool) -> None:
        """Forward the next (at most `budget`) tokens of the request's prompt on its own prompt
        row (`_forward_piece`), the running rows (`batch_running`: there are some) set aside as
        snapshots; once the whole prompt is in, its n rows join the end of the batch (`_join`)
        and `request.logits` is set, `(n, V)`."""
        prompt_ids, cache, companions = request.prompt_ids, self.cache, self.companions
        begin = request.prefilled
        end = min(len(prompt_ids), begin + budget)
        last = end == len(prompt_ids)
        running = [cache.snapshot(row) for row in range(cache.batch_size)] if batch_running else []
        aside = companions.set_aside(batch_running) if companions is not None else []
        try:
            if companions is not None:  # first: their prompt rows are the request's to free if the rest fails
                companion_logits = companions.forward_piece(request, begin, end, last)
            logits, prompt_row = self._forward_piece(request, begin, end, last)
            if last:
                self._join(request, running, prompt_row)
                if companions is not None:
                    companions.join(request, aside)
                    request.companion_logits = [out.expand(request.params.n, -1) for out in companion_logits]
            else:
                cache.restore(running)
                request.prompt_row = prompt_row
                if companions is not None:
                    companions.restore(aside)
        except Exception:
            cache.restore(running)  # the running rows are untouched by a failed prefill
            if companions is not None:
                companions.restore(aside)
            raise
        finally:
            for snapshot in running:
                cache.release(snapshot)
            if companions is not None:
                companions.drop(aside)
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
        cache = self.cache
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
        prompt indexed in the prefix cache and locked while the request runs."""
        self.cache.restore(running + [prompt_row] * request.params.n)
        self.prefixes.hold(request, prompt_row)
        self.cache.release(prompt_row)
