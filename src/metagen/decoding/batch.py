"""`RowBatch`: one request's rows decoding together — its set-up and the one "drop finished rows".

Every loop that decodes rows (the sampling loop, jump-forward, speculative decoding, the serving
engine, beam search, tokenwise controlled decoding, the tree expander) starts and shrinks its
rows here, as nano-vllm's scheduler works over one `Sequence` type:

    batch = RowBatch.start(model, prompt_ids, params, ...)  # stop rules → generator → memory check
                                                            #   → request chain → one Row per completion
    cache, out = batch.prefill(prompt_cache)                # the prompt once (or a PromptCache's copy),
                                                            #   forked into n cache rows
    text = batch.push(b, token, record)                     # live row b takes a token (rows.Row.push)
    batch.keep(batch.live())                                # finished rows leave: cache, chain, followers
                                                            #   (a drafter's rows) and `active` move together

`active[b]` is the completion index live row b holds (rows leave the batch, completions stay in
`rows` / `completions` in their order). In the serving engine many requests share one cache, so
a request's `RowBatch` has no cache of its own (`cache=None`): the engine selects the shared
cache's rows once per step for every request, and `keep` moves the request's chain and rows.

The loops whose rows are not n plain samples use the same pieces: beam search and tokenwise
controlled decoding are set up by `start` (`forward_rows=` / `what=`: the memory check of the
rows they really forward, 2·width candidates or n·top_k, naming the option that sizes them);
tokenwise CD keeps the chosen candidate's cache row with `keep(indices, cache_rows=)`; the tree
expander builds a batch of its children's forked rows (`rows=`) and drops the rows whose step
ended with `keep`. Beam search ranks and forks its candidates itself (the candidates are not a
subset of the live rows).

Companion models (`combiner=`, a `combine.LogitsCombiner`: contrastive decoding's amateur)
run on the same rows: each has its own cache, prefilled on the same prompt and forked into the
n rows, moved by `keep`, forked by `select_rows` and rolled back by `truncate` together with the
main cache, so row b of every cache holds the same tokens. `forward` runs every model on the
fed tokens and `scores` gives what the chain processes (the combiner's output; the main logits
themselves without companions, so the single-model step does no extra work). Every model's
forwards are counted in the one `Cost` (a model call and its FLOPs each; the target steps are
the main model's) and every model's cache bytes in the one memory check.

A switching combiner (`combine.SwitchingCombiner`, entropy-adaptive decoding) runs its
companions only at the steps some row needs them: after each main forward (and the prefill)
its per-request `switch` decides which rows take the companions' logits (`decide`); when any
does, the companions catch up on the tokens they missed (`lazy_companions.LazyCompanions`: the
prompt the first time, then one forward of each row's missed tokens, counted in the step's
`Cost`), so their logits are a fresh prefill's of the same prefix. Their tokens per model end in
`GenerationResult.model_tokens`. It runs in the sampling loop only (not with `forward_rows`).

The batch also opens and closes the request's `Cost` (`prefill_cost`, `finish_cost`); the loop
adds each forward it runs in between (`cost.forward_cost`), so the code that spends it counts it.

Cost: `keep` is O(B) plus the cache's and the processors' own `select` (O(B) page-table ints for
the paged cache, a gather of each processor's per-row state).
"""

from __future__ import annotations

from collections.abc import Sequence

import time

import torch

from metagen.decoding.combine import CompanionSlots, LogitsCombiner, SwitchingCombiner, check_same_vocabulary
from metagen.decoding.cost import Cost, forward_cost, prefill_cost
from metagen.decoding.lazy_companions import LazyCompanions
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompt_cache import PromptCache
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import TokenRecord
from metagen.decoding.request import heal_request, request_chain
from metagen.decoding.rows import Row
from metagen.decoding.stop_rules import StopRules
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams, StopVerdict


class RowBatch:
    """The live rows of one request: its stop rules, sampler chain, generator and `Row`s, and the
    cache rows they decode in (None when the cache is shared with other requests).

    Attributes:
        rows: one `Row` per completion, in completion order (finished ones stay).
        active: the completion index of each live row, in cache-row order.
        followers: objects with `select(indices)` whose rows follow the cache's (a drafter).
        combiner: the `LogitsCombiner` whose `companions` run next to the model, or None.
        companion_caches: each companion's cache (after `prefill`), rows aligned with `cache`'s.
        switch: a `SwitchingCombiner`'s per-request state (after `prefill`), else None.
        lazy: its `LazyCompanions` (after `prefill`), else None.
    """

    def __init__(self, model, prompt_ids: list[int], params: SamplingParams, rules: StopRules, chain: SamplerChain,
                 generator: torch.Generator | None, *, healed: str = "", rows: list[Row] | None = None,
                 cache=None, combiner: LogitsCombiner | SwitchingCombiner | None = None) -> None:
        """`rows`: rows already under way, one per chain row (the tree expander's children, each
        forked from its parent's row); None: `params.n` fresh rows. `cache`: the cache the rows
        decode in, when the batch owns it from the start (else `prefill` sets it)."""
        self.model, self.prompt_ids, self.params, self.rules = model, prompt_ids, params, rules
        self.chain, self.generator, self.healed = chain, generator, healed
        if rows is None:
            rows = [Row(model.tokenizer, prompt_ids, rules, want_top=bool(params.logprobs), skip_text=healed)
                    for _ in range(params.n)]
        self.rows = rows
        self.active = list(range(len(rows)))
        self.cache = cache
        self.prompt_reused = False  # the prefill took the prompt from a PromptCache
        self.followers: list = []
        self.combiner = combiner
        self.slots = CompanionSlots(model, () if combiner is None else combiner.companions)
        self.companions: tuple = self.slots.running  # the ones running forwards (`CompanionSlots`)
        self.companion_caches: list = []
        self._companion_logits: list[torch.Tensor] = []  # each companion's (B, V) of the last forward
        self.switching = isinstance(combiner, SwitchingCombiner)
        self.switch, self.lazy = None, None
        self._use: torch.Tensor | None = None  # (B,) bool: the rows taking the companions' logits this step
        self._prefill_extra = None  # a switching combiner's companion prefill at the prompt (`prefill_cost`)

    @classmethod
    def start(cls, model, prompt_ids: list[int], params: SamplingParams, processors: Sequence[LogitsProcessor] = (),
              *, healed: str = "", generator: torch.Generator | None = None, rows_in_use: int = 0,
              positions: int = 1, forward_rows: int | None = None, what: str = "n",
              combiner: LogitsCombiner | SwitchingCombiner | None = None,
              vocabulary_checked: bool = False, draft_models: Sequence = ()) -> RowBatch:
        """Set up a request of `params.n` rows: its stop rules (ValueError when the prompt leaves
        no room), its generator (`generator`, else `params.seed`'s, else fresh OS entropy; torch's
        global RNG is left alone), the memory check of `rows_in_use + forward_rows` rows scoring
        `positions` tokens at a time (before any per-row state is allocated; `forward_rows`: the
        rows each forward runs, n by default — beam search's 2·width candidates, tokenwise CD's
        n·top_k, AdaDec's n·(B + 1): the n rows held aside and their lookahead rows — and `what`
        the option named when they cannot fit), its sampler chain
        (`request_chain`: `processors` first, each with its state after the prompt for one row)
        and one `Row` per completion. `combiner`: its companions must share the model's
        vocabulary (ValueError naming both models; O(V) unless they share the tokenizer object,
        skipped with `vocabulary_checked`: the serving engine checks once, at its start) and
        their caches join the memory check, as do those of `draft_models` (a drafter's models,
        `Drafter.draft_models`, each with a cache of the same rows); a `SwitchingCombiner`
        decodes in the sampling loop only (ValueError with `forward_rows`)."""
        if isinstance(combiner, SwitchingCombiner) and forward_rows is not None:
            raise ValueError(f"{type(combiner).__name__} switches models row by row in the sampling loop; "
                             f"it does not run with --{what.replace('_', '-')} (beam search, tokenwise decoding)")
        rules = StopRules.from_params(params, model, len(prompt_ids))
        if generator is None:
            generator = params.make_generator()
        forward_rows = params.n if forward_rows is None else forward_rows
        models = [model, *draft_models]
        if combiner is not None:
            running = CompanionSlots(model, combiner.companions).running
            for companion in () if vocabulary_checked else running:
                check_same_vocabulary(model, companion)
            models += running
        check_batch_fits(models, rows_in_use + forward_rows, rules.max_new_tokens, positions, what=what)
        chain = request_chain(params, model, prompt_ids, params.n, processors, healed=healed)
        return cls(model, prompt_ids, params, rules, chain, generator, healed=healed, combiner=combiner)

    @classmethod
    def for_prompt(cls, model, prompt: Prompt, params: SamplingParams, processors: Sequence[LogitsProcessor] = (),
                   *, chat: bool | None = None, generator: torch.Generator | None = None,
                   positions: int = 1, combiner: LogitsCombiner | SwitchingCombiner | None = None,
                   forward_rows: int | None = None, what: str = "n") -> RowBatch:
        """`start` for a prompt as given (text, chat messages or token ids): encoded, and healed
        when `params.token_healing` asks (`request.heal_request`)."""
        prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
        prompt_ids, healed = heal_request(params, model, prompt, chat, prompt_ids)
        return cls.start(model, prompt_ids, params, processors, healed=healed, generator=generator,
                         positions=positions, forward_rows=forward_rows, what=what, combiner=combiner)

    @property
    def completions(self):
        return [row.completion for row in self.rows]

    def fill(self, result):
        """`result` (a `GenerationResult`) given this request's prompt, healed text and
        completions (filled as the rows grow)."""
        result.prompt_token_ids, result.healed_text = self.prompt_ids, self.healed
        result.completions = self.completions
        return result

    def prefill(self, prompt_cache: PromptCache | None = None):
        """Prefill the prompt once and fork its cache into the n rows; returns `(cache, out)`
        with `out.logits (n, V)` (`model.prefill`, or `prompt_cache.prefill`, which reuses the
        last prompt's keys and values when the ids are the same). The batch owns the cache from
        then on."""
        if prompt_cache is None:
            self.cache, out = self.model.prefill(self.prompt_ids, batch_size=self.params.n)
        else:
            self.cache, out, self.prompt_reused = prompt_cache.prefill(self.model, self.prompt_ids, self.params.n)
        self.companion_caches, self._companion_logits = [], []
        if self.switching:
            self.switch, self.lazy = self.combiner.start(self.params.n), LazyCompanions(
                self.companions, self.prompt_ids, self.params.n)
            self._prefill_extra = self._switch_step(out.logits)
            return self.cache, out
        for companion in self.companions:  # the same prompt, forked into the same n rows
            companion_cache, companion_out = companion.prefill(self.prompt_ids, batch_size=self.params.n)
            self.companion_caches.append(companion_cache)
            self._companion_logits.append(companion_out.logits)
        return self.cache, out

    def prefill_cost(self) -> Cost:
        """The `Cost` of the prefill just run: one model call computing the prompt once (the
        other n − 1 rows reuse it through the forked cache), its FLOPs, and one target step per
        row (each row's first token comes from it); a prompt taken from a `PromptCache` is
        reused by all n rows, with no model call and no FLOPs (`cost.prefill_cost`)."""
        cost = prefill_cost(self.model, len(self.prompt_ids), self.params.n, reused=self.prompt_reused)
        if self.switching:  # the companions' prefill ran only if a row needed them at once
            return cost + self._prefill_extra
        for companion in self.companions:  # its own call and FLOPs; the target steps are the model's
            cost += prefill_cost(companion, len(self.prompt_ids), self.params.n, produced=False)
        return cost

    def forward(self, tokens: torch.Tensor, starts: Sequence[int]) -> tuple[torch.Tensor, Cost]:
        """Every model appends `tokens` (B, 1) to its cache rows (row b's token at position
        `starts[b]`); returns the model's logits (B, V) and the forwards' `Cost` (`forward_cost`
        of each model: a call and its FLOPs each, one target step per row for the model's). The
        companions' logits wait for `scores`."""
        cost = forward_cost(self.model, starts)
        logits = self.model.forward(self.cache, tokens).logits  # (B, V)
        if self.switching:
            self.lazy.fed(tokens)
            return logits, cost + self._switch_step(logits)
        if self.companions:
            self._companion_logits = []
            for companion, cache in zip(self.companions, self.companion_caches):
                cost += forward_cost(companion, starts, produced=False)
                self._companion_logits.append(companion.forward(cache, tokens).logits)  # (B, V)
        return logits, cost

    def _switch_step(self, logits: torch.Tensor) -> Cost:
        """The switch decides on the main `logits` (B, V) which rows take the companions' logits;
        when any does, the companions catch up (`LazyCompanions.sync`). Returns what they ran."""
        self._use = self.switch.decide(logits)  # (B,) bool
        if not bool(self._use.any()):
            self._companion_logits = [None] * len(self.companions)
            return Cost()
        self._companion_logits, cost = self.lazy.sync()
        return cost

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """What the chain processes after the last `prefill` / `forward`: the combiner's scores
        (B, V) of the model's `logits` and the companions', or `logits` itself without one."""
        if self.combiner is None:
            return logits
        if self.switching:
            return self.switch.combine(self.slots.full(logits, self._companion_logits), self._use)
        return self.combiner.combine(self.slots.full(logits, self._companion_logits))

    def select_rows(self, indices: Sequence[int]) -> None:
        """Every cache's rows become `[rows[i] for i in indices]` (repeats fork: beam search's
        parents) before the next `forward`; the chain and `active` are left to the caller."""
        self.cache.select(indices)
        for cache in self.companion_caches:
            cache.select(indices)
        self._select_switch(indices)

    def _select_switch(self, indices: Sequence[int]) -> None:
        if self.switch is not None:
            self.switch.select(indices)
            self.lazy.select(indices)

    def truncate(self, row: int, length: int) -> None:
        """Roll back cache row `row` of every model to its first `length` tokens."""
        self.cache.truncate(row, length)
        for cache in self.companion_caches:
            cache.truncate(row, length)
        if self.lazy is not None:
            self.lazy.truncate(row, length)

    def keep_path(self, row: int, start: int, kept: list[int]) -> None:
        """Keep the root-to-node path `kept` of a token tree fed to cache row `row` at `start`
        (`PagedCache.keep_path`; tree drafts run on one model, no companions)."""
        if self.companion_caches or self.lazy is not None:
            raise ValueError("token trees run on one model: a logits combiner's companions cannot keep a tree path")
        self.cache.keep_path(row, start, kept)

    def finish_cost(self, result, started: float) -> None:
        """Close `result.cost` when the rows are done: the tokens they generated and the wall
        time since `started` (a `time.perf_counter()` value)."""
        result.cost.generated_tokens = result.generated_tokens
        if self.switch is not None:
            result.model_tokens = dict(self.switch.tokens)
        result.cost.wall_seconds = time.perf_counter() - started

    def row(self, b: int) -> Row:
        """The `Row` live row `b` decodes."""
        return self.rows[self.active[b]]

    def push(self, b: int, token: int, record: TokenRecord, verdict: StopVerdict | None = None) -> str:
        """Live row `b` takes `token` (`Row.push`; `verdict`: the processors' (may_stop,
        must_stop) after it, by default the chain's now); returns the text it makes safe to show."""
        return self.row(b).push(token, record, self.chain.stop_verdict(b) if verdict is None else verdict)

    def live(self) -> list[int]:
        """The live rows that have not finished, in order."""
        return [b for b, index in enumerate(self.active) if not self.rows[index].finished]

    def keep(self, indices: list[int], *, cache_rows: list[int] | None = None) -> None:
        """Live row i becomes old live row `indices[i]` (`indices`: increasing, non-empty; the
        rows left out leave): the cache (when the batch owns one), the chain, the followers and
        `active` move together. A no-op when every row stays. `cache_rows`: the cache row live
        row i continues in, when the cache holds other rows than the live ones (tokenwise CD's
        k candidate rows per live row: the chosen candidate's); the cache is then selected even
        when every row stays."""
        if cache_rows is not None and self.cache is not None:
            self.cache.select(cache_rows)
            for cache in self.companion_caches:
                cache.select(cache_rows)
        if len(indices) == len(self.active):  # increasing: all of them, in order
            return
        if self.cache is not None and cache_rows is None:
            self.cache.select(indices)
            for cache in self.companion_caches:
                cache.select(indices)
            self._select_switch(indices)
        self.chain.select(torch.tensor(indices, dtype=torch.long))
        for follower in self.followers:
            follower.select(indices)
        self.active = [self.active[b] for b in indices]
