"""Speculative decoding in the serving engine: a draft / verify stage over the running batch, as
vLLM's engine runs n-gram (prompt-lookup) speculation inside continuous batching.

`metagen serve --speculative NAME` drafts with any registered drafter: model-free (n-gram /
prompt lookup, token recycling, RASD with a corpus, STAND), Medusa heads (the forward then also
returns the hidden states they read), or draft models (early-exit, quantized, a model file, their
trees: tree, spectr, dyspec; RASD fused with a tree, S2D's nested exits, PEARL, whose rounds run
serially here: the engine's one thread runs every forward). Each request gets its own copy
(`Drafter.for_request`) and the verification is the generate loop's own (`config.verify`:
token, block, draw, multi-draft, spectr, pearl). A draft model's copy keeps its own cache of the
request's rows: `start` prefills the prompt on it when the request's first tokens are drawn, it
follows the rows that stay (`select`, as a follower of the request's `RowBatch`) and truncates
what verification rejected at its next proposal; its bytes per token join the admission check
(`RowBatch.start(draft_models=)`). The draft forwards are per request (R requests: R draft
forwards a step, then the one target forward); the prompt's draft prefill is not chunked.
Between steps the shared cache holds every committed token of a running row but its last, t0,
as in `decoding.draft_loop`. One engine step:

    first_tokens (requests whose prompt just joined): each row's first token drawn from the
        prefill's logits as plain decoding draws it (`draft_loop.first_tokens`); the request's
        drafter starts and follows its rows (`RowBatch.followers`)
    ... the scheduler drops the rows that ended (`Scheduler.settle`) ...
    step, over the running requests in batch order:
        draft_r, feed_r = propose_drafts(request r)         # [t0] + its draft per live row
        logits = score_drafts(model, cache, feed_1 + ... + feed_R, tree_masks)   # ONE ragged forward
                                                            # (+ hidden states when a drafter reads them)
        per request r (rows a..b):                          # (k_r, 1 + its longest feed, V) view
            verify_drafts(r, logits[a:b])                   # the generate loop's step: verification,
                                                            # cache.truncate / keep_path of rows a..b,
                                                            # contexts, γ, drafter.observe (and
                                                            # observe_hidden: Medusa heads)
    ... the scheduler drops the rows that ended (`Scheduler.settle`) ...

A row without a draft (nothing found, no budget left) feeds t0 alone; trees (multi-draft, spectr)
and chains share the forward (`tree=` per row, None for a chain's). Each request verifies with its
own chain and generator, so its output does not depend on its batch companions but through the
rounding of a batched forward: greedy output is plain decoding's, and sampled output follows
plain decoding's law (the verification's guarantee; `draw` and one seeded row: plain decoding's
very tokens for a drafter drawing no random numbers).

Events: a step may push several tokens into a row; each becomes its own `TokenEvent` (its text,
its record, the finish reason on the last), in order, so streams, usage and logprobs read the same
as one token per step. Counters: `EngineStats.draft_tokens` / `accepted_tokens` (vLLM's
num_draft_tokens / num_accepted_tokens) and `drafts` (rows that were given a draft).

The drafter the engine was given keeps what lasts across requests (`finish` is called on it when a
request ends, with its outputs); the copies read it. Cost per step: the drafters' lookups, one
forward of Σ_b (1 + γ_b) tokens, and each request's verification, O(k_r · (1 + γ) · V).
"""

from __future__ import annotations

from collections.abc import Generator
from metagen.decoding.draft_loop import first_tokens, propose_drafts, score_drafts, tree_masks, verify_drafts
from metagen.decoding.drafts import Draft, Drafter
from metagen.decoding.records import TokenRecord
from metagen.sampling import SamplingParams
from metagen.serve.request_state import Drafting, EngineRequest
from metagen.serve.requests import DoneEvent, EngineStats, TokenEvent
from metagen.speculative.loop import SpeculativeConfig, check_compatible
from metagen.speculative.registry import make_verification


class SpeculativeStage:
    """The draft / verify stage over `model` and the engine's shared `cache` (engine thread only):
    `drafter` (any registered one) drafts for every request, `config` says
    how many tokens and which rule verifies them (ValueError when the rule cannot verify the
    drafter's drafts); `stats` counts draft and accepted tokens."""

    def __init__(self, model, cache, drafter: Drafter, config: SpeculativeConfig, stats: EngineStats) -> None:
        self.model, self.cache, self.drafter, self.config, self.stats = model, cache, drafter, config, stats
        self.verification = make_verification(config.verify)
        check_compatible(model, drafter, SamplingParams(), config)  # the rule verifies its drafts
        gamma = config.max_draft_tokens if config.adaptive else config.num_draft_tokens
        most = gamma if drafter.max_nodes is None else max(gamma, drafter.max_nodes)
        self.positions = 1 + most  # tokens a row feeds per step at most (the admission check's)

    def check(self, params: SamplingParams) -> None:
        """ValueError for a request the stage cannot verify (Mirostat under the token / block
        rules: `check_compatible`), at submission."""
        check_compatible(self.model, self.drafter, params, self.config)

    def first_tokens(self, decoding: list[tuple[EngineRequest, range]]) -> list[tuple[EngineRequest, DoneEvent]]:
        """Each request whose prompt just joined (it holds the prefill's `logits (n, V)`) draws
        its rows' first tokens and starts drafting (`draft_loop.first_tokens`); returns the
        requests that failed, each with its event."""
        failed = []
        for request, _ in decoding:
            if request.logits is None:
                continue
            batch = request.batch
            try:
                drafter = self.drafter.for_request()
                drafter.start(request.prompt_ids, len(batch.active))
                batch.followers.append(drafter)
                contexts = self._emit(request, first_tokens(batch, drafter, request.logits))
                request.drafting = Drafting(drafter, contexts, [self.config.num_draft_tokens] * len(contexts))
                self._finished(request)
            except Exception as error:  # noqa: BLE001 - fail this request only
                failed.append((request, DoneEvent(f"{type(error).__name__}: {error}")))
            request.logits = None
        return failed

    def step(self, running: list[EngineRequest]) -> tuple[list[tuple[EngineRequest, range]],
                                                          list[tuple[EngineRequest, DoneEvent]]]:
        """Draft for every running request, score every row in one forward, verify each request
        on its slice (module docstring). Returns the requests verified with their cache rows, and
        those that failed with their event (their rows are in neither: the scheduler drops them);
        a failed forward fails every request (the batch is lost: the caller resets the cache)."""
        entries, failed = [], []
        for request in running:
            state, batch = request.drafting, request.batch
            try:
                draft, feed = propose_drafts(batch, state.drafter, self.verification, state.contexts, state.gammas)
            except Exception as error:  # noqa: BLE001 - its rows feed t0 alone, then leave
                failed.append((request, DoneEvent(f"{type(error).__name__}: {error}")))
                draft = Draft.chain([[] for _ in batch.active])
                feed = [[state.contexts[index][-1]] for index in batch.active]
            entries.append((request, draft, feed))
        feeds = [tokens for _, _, feed in entries for tokens in feed]
        before = self.cache.lengths
        hidden = any(request.drafting.drafter.reads_hidden for request, _, _ in entries)
        scored = score_drafts(self.model, self.cache, feeds, tree_masks([draft for _, draft, _ in entries]),
                              hidden=hidden)
        logits = scored.logits
        stats = self.stats
        stats.steps += 1
        stats.step_rows += len(feeds)
        stats.max_batch_rows = max(stats.max_batch_rows, len(feeds))
        verified, start, refused = [], 0, {id(request) for request, _ in failed}
        for request, draft, feed in entries:
            rows = range(start, start + len(feed))
            start = rows.stop
            if id(request) in refused:
                continue
            state = request.drafting
            width = max(len(tokens) for tokens in feed)
            try:
                states = scored.hidden[rows.start:rows.stop, :width] if state.drafter.reads_hidden else None
                counts = self._emit(request, verify_drafts(
                    request.batch, state.drafter, self.verification, draft, feed, logits[rows.start:rows.stop, :width],
                    self.cache, rows, before[rows.start:rows.stop], state.contexts, state.gammas, self.config,
                    hidden=states))
                self._finished(request)
            except Exception as error:  # noqa: BLE001 - fail this request only
                failed.append((request, DoneEvent(f"{type(error).__name__}: {error}")))
                continue
            stats.drafts += sum(1 for proposed, _ in counts if proposed)
            stats.draft_tokens += sum(proposed for proposed, _ in counts)
            stats.accepted_tokens += sum(taken for _, taken in counts)
            verified.append((request, rows))
        return verified, failed

    def _finished(self, request: EngineRequest) -> None:
        """A request whose rows have all ended: the server's drafter remembers its outputs."""
        batch = request.batch
        if not batch.live():
            self.drafter.finish([row.completion.token_ids for row in batch.rows])

    def _emit(self, request: EngineRequest, steps: Generator):
        """Run `steps` (a verification pushing tokens into the request's rows) to its end and
        emit one `TokenEvent` per token pushed, row by row in order: the text its push made safe
        to show (the verification's event right after it; "" when it had none), its record, and
        the row's finish on its last. Returns what `steps` returns."""
        batch, emit = request.batch, request.request.emit
        completions = {index: batch.rows[index].completion for index in batch.active}
        starts = {index: len(completion.token_ids) for index, completion in completions.items()}
        texts: dict[tuple[int, int], str] = {}  # (completion, position) -> its text
        while True:
            try:
                event = next(steps)
            except StopIteration as stop:
                result = stop.value
                break
            texts[event.index, len(completions[event.index].token_ids) - 1] = event.text
        for index, completion in completions.items():
            end = len(completion.token_ids)
            for position in range(starts[index], end):
                last = position == end - 1
                top = None if completion.top_logprobs is None else completion.top_logprobs[position]
                record = TokenRecord(completion.logprobs[position], completion.sampling_logprobs[position],
                                     completion.certainties[position], top)
                emit(TokenEvent(index, texts.get((index, position), ""), completion.token_ids[position], record,
                                completion.finish_reason if last else None, completion.stop_reason if last else None))
            self.stats.generated_tokens += end - starts[index]
        return result


def speculation_card(stage: SpeculativeStage) -> dict:
    """What `/v1/models` and `/health` say of a server that decodes speculatively."""
    config = stage.config
    return {"method": "speculative", "drafter": stage.drafter.name, "num_draft_tokens": config.num_draft_tokens,
            "verify": config.verify, "adaptive": config.adaptive}
