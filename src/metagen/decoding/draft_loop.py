"""The speculative loop: draft tokens per row, score them with one target forward, verify, repeat.

Per step, over the live rows of a `RowBatch` (the target cache holds every committed token but
each row's last, t0):

    draft      = drafter.propose(contexts, lengths, chain, generator)   # d_1..d_γ per row, γ_b ≤ lengths[b]
    logits     = model.forward(cache, [[t0] + d per row], logits="all")   # (B, 1 + longest draft, V)
    tau, x     = verification.verify(batch, logits, draft)              # pushes d_1..d_tau, x into the rows
    drafter.observe(feed, logits, kept)                                  # every position, and the kept paths
    drafter.observe_hidden(hidden, kept)                                 # only a drafter that `reads_hidden`
    cache.truncate(row, old + 1 + tau)                                   # the untaken draft tokens leave

A tree draft (`Draft.parents`, a verification with `trees`: `speculative.tree_verify`) is fed
the same way, t0 then the nodes, with `tree=` (t0 the root, ancestor-only attention), so one
forward scores every node; the verification returns the kept path's nodes, and
`cache.keep_path(row, old, [0] + [1 + i for i in path])` keeps t0 and that path, releasing the
other nodes. The chain and the rows take the path's tokens in order, as for a kept chain prefix.

The step is four functions the serving engine runs too (serve/speculation.py, over the requests
of its batch and one shared forward): `first_tokens`, `propose_drafts`, `score_drafts` (with
`tree_masks`) and `verify_drafts` (the verification, the cache rows kept, the drafter observing).

The first token of every row comes from the prefill's logits, drawn as plain decoding draws it
(`DrawVerification` of empty drafts). Rows accept different numbers of tokens, so the next
forward is ragged; finished rows leave the batch (`RowBatch.keep`, the drafter following).

Two verifications plug in: the rules of `metagen.speculative` (token / block / greedy: each
row's positions processed first, then a rule on p and q, the chain rolled back to what it kept)
and `draw_verify.DrawVerification` (a draw from q at each position, kept while it equals the
draft token). Two kinds of drafter: the models and n-gram tables of `metagen.speculative`, and
`jump_forward.ForcedRunDrafter` (the runs a constraint forces), which `sample_loop.stream` decodes
here with draw verification: jump-forward is this loop.

Cost: the loop fills `result.cost` as it spends it — the prefill (`RowBatch.prefill_cost`) plus
the drafter's prefill FLOPs, per step the drafter's calls and FLOPs and the target forward
(`cost.forward_cost`: one model call, the FLOPs of each row's 1 + γ_b tokens (tree nodes) at its position,
the tokens a verification left included, and one target step per row). Draft tokens proposed and accepted go
to `cost.draft_tokens` / `cost.accepted_tokens`; a forced drafter's taken tokens go to
`GenerationResult.forced_tokens` instead (they are the constraint's text, not a speculation).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence

from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_cost
from metagen.decoding.draw_verify import DrawVerification
from metagen.decoding.drafts import Draft, Drafter, DraftSchedule, Verification
from metagen.decoding.prompt_cache import PromptCache
from metagen.decoding.result import GenerationResult, StreamEvent

__all__ = ["check_draft", "draft_stream", "first_tokens", "propose_drafts", "score_drafts", "tree_masks",
           "verify_drafts"]


def draft_stream(batch: RowBatch, drafter: Drafter, verification: Verification, result: GenerationResult,
                 started: float, schedule: DraftSchedule | None = None, *,
                 prompt_cache: PromptCache | None = None) -> Iterator[StreamEvent]:
    """Decode `batch` (set up, not yet prefilled) to the end with `drafter`'s drafts checked by
    `verification`, yielding events and filling `result` and its `Cost` (from `started`, a
    perf_counter value). `schedule`: the draft lengths γ (None: a row's budget is the only limit).
    `prompt_cache`: see `RowBatch.prefill`."""
    if batch.companions:
        raise ValueError("the speculative loop runs one model: a logits combiner's companion models "
                         "(contrastive decoding) decode with the sampling loop or beam search")
    model, rows = batch.model, batch.rows
    n, max_new = batch.params.n, batch.rules.max_new_tokens
    cache, out = batch.prefill(prompt_cache)
    cost = result.cost = batch.prefill_cost()
    drafter.start(batch.prompt_ids, n, target_cache=cache)
    finished = False
    try:
        batch.followers.append(drafter)
        cost.flops += drafter.prefill_flops
        result.prefill_seconds = time.perf_counter() - started
        decode_start = time.perf_counter()
        contexts = yield from first_tokens(batch, drafter, out.logits)  # per completion: prompt + committed tokens
        gammas = [schedule.num_draft_tokens if schedule is not None else max_new] * n  # per completion

        while True:
            keep = batch.live()
            if not keep:
                break
            batch.keep(keep)
            draft, feed = propose_drafts(batch, drafter, verification, contexts, gammas)
            cost.model_calls += draft.calls
            cost.flops += draft.flops
            before = cache.lengths
            cost += forward_cost(model, before, [len(tokens) for tokens in feed])
            scored = score_drafts(model, cache, feed, tree_masks([draft]), hidden=drafter.reads_hidden)
            counts = yield from verify_drafts(batch, drafter, verification, draft, feed, scored.logits, cache,
                                              range(len(feed)), before, contexts, gammas, schedule,
                                              hidden=scored.hidden)
            for proposed, tau in counts:
                if drafter.forced:
                    result.forced_tokens += tau
                else:
                    cost.draft_tokens += proposed
                    cost.accepted_tokens += tau

        drafter.finish([row.completion.token_ids for row in rows])
        finished = True
    finally:  # a stream abandoned or failed mid-way: the drafter still ends its request (threads, pools)
        if not finished:
            drafter.finish([])
    result.decode_seconds = time.perf_counter() - decode_start
    batch.finish_cost(result, started)


def first_tokens(batch: RowBatch, drafter: Drafter, logits: Tensor) -> Generator[StreamEvent, None, list[list[int]]]:
    """Each row's first token from the prefill's `logits (n, V)`, drawn as plain decoding draws
    it (`DrawVerification` of empty drafts), after `drafter` observed them (the prompt's last
    token fed). Returns each completion's context: the prompt and that token."""
    n = len(batch.active)
    if batch.prompt_ids:
        drafter.observe([[batch.prompt_ids[-1]]] * n, logits[:, None])  # (n, 1, V): after the prompt
    first = yield from DrawVerification().verify(batch, logits[:, None], Draft.chain([[] for _ in range(n)]))
    return [list(batch.prompt_ids) + [x] for _, x in first]


def propose_drafts(batch: RowBatch, drafter: Drafter, verification: Verification, contexts: list[list[int]],
                   gammas: list[int]) -> tuple[Draft, list[list[int]]]:
    """The drafter's draft for the live rows (`contexts`, `gammas`: per completion), each path
    at most its γ and what its row's budget leaves (`verification.spare` kept free), checked
    (`check_draft`); returns it and what each row feeds: `[t0] + draft.tokens[b]`."""
    active, rows, max_new = batch.active, batch.rows, batch.rules.max_new_tokens
    row_contexts = [contexts[index] for index in active]
    lengths = [max(0, min(gammas[index], max_new - len(rows[index].completion.token_ids) - verification.spare))
               for index in active]
    draft = drafter.propose(row_contexts, lengths, batch.chain, batch.generator)
    check_draft(draft, lengths, batch.model.vocab_size, drafter.name, trees=verification.trees)
    return draft, [[context[-1]] + draft.tokens[b] for b, context in enumerate(row_contexts)]


def tree_masks(drafts: Sequence[Draft]) -> list[list[int] | None] | None:
    """The forward's `tree=` for the rows of `drafts` in order: None when every row is a chain,
    else per row None (a row of a chain draft) or its parents with t0 the root (node i fed at 1 + i, its
    parent at 1 + parents[i]), so one forward scores every node with ancestor-only attention."""
    if all(draft.is_chain for draft in drafts):
        return None
    return [None if draft.is_chain else [-1] + [parent + 1 for parent in parents]
            for draft in drafts for parents in draft.parents]


def score_drafts(model, cache, feed: list[list[int]], tree: list[list[int] | None] | None, *, hidden: bool = False):
    """One target forward of `feed[b]` appended to cache row b (with `tree=` when a row is a
    tree); its output: logits at every fed position, `(B, 1 + longest feed, V)`, and with `hidden`
    the last hidden states there, `(B, 1 + longest feed, H)` (for a drafter that `reads_hidden`)."""
    extra = {"hidden": True} if hidden else {}
    if tree is None:
        return model.forward(cache, feed, logits="all", **extra)
    return model.forward(cache, feed, logits="all", tree=tree, **extra)


def verify_drafts(batch: RowBatch, drafter: Drafter, verification: Verification, draft: Draft,
                  feed: list[list[int]], logits: Tensor, cache, cache_rows: Sequence[int], before: Sequence[int],
                  contexts: list[list[int]], gammas: list[int], schedule: DraftSchedule | None = None, *,
                  hidden: Tensor | None = None) -> Generator[StreamEvent, None, list[tuple[int, int]]]:
    """The verification of one scored draft, the one step the loop and the serving engine share:
    `verification.verify` pushes each live row's taken tokens (yielding its events), then live row
    b's cache row `cache_rows[b]` (fed at `before[b]`) keeps t0 and the taken path (`keep_path` for
    a tree, `truncate` for a chain), its context takes the path and the token after it, its γ
    follows `schedule`, and the drafter observes the forward (its `hidden (B, 1 + most nodes, H)`
    too when it `reads_hidden`). `logits (B, 1 + most nodes, V)`.
    Returns per live row (draft tokens proposed, draft tokens taken)."""
    outcomes = yield from verification.verify(batch, logits, draft)
    counts: list[tuple[int, int]] = []
    kept: list[tuple[list[int], int]] = []  # per row: the kept path's nodes, the token after it
    for b, (index, proposed, outcome) in enumerate(zip(batch.active, draft.tokens, outcomes)):
        tau, token = outcome[0], outcome[1]
        nodes = outcome[2] if len(outcome) > 2 else range(tau)  # the kept path's nodes
        if not draft.is_chain:  # keep t0 and the path, release the other nodes
            cache.keep_path(cache_rows[b], before[b], [0] + [1 + i for i in nodes])
        elif tau < len(proposed):
            cache.truncate(cache_rows[b], before[b] + 1 + tau)
        if schedule is not None:
            deepest = max((draft.depth(b, i) for i in range(len(proposed))), default=0)
            gammas[index] = schedule.next_length(gammas[index], deepest, tau)
        contexts[index] += [proposed[i] for i in nodes] + [token]
        kept.append((list(nodes), token))
        counts.append((len(proposed), tau))
    drafter.observe(feed, logits, kept)
    if drafter.reads_hidden:
        drafter.observe_hidden(hidden, kept)
    return counts


def check_draft(draft: Draft, lengths: list[int], vocab: int, name: str, *, trees: bool = False) -> None:
    """RuntimeError unless `draft` has one row per length, no path longer than its length, and
    tokens within the vocabulary; a tree (a row that branches) only when `trees` (the
    verification verifies trees: the forward then runs tree attention)."""
    if len(draft.tokens) != len(lengths):
        raise RuntimeError(f"the {name} drafter returned {len(draft.tokens)} rows, expected {len(lengths)}")
    if not trees and not draft.is_chain:
        raise RuntimeError(f"the {name} drafter proposed a tree draft, which this verification cannot verify "
                           "(a chain rule: parents [-1, 0, 1, ...] in every row); verify it with a tree rule "
                           "(verify='multi-draft')")
    for b, (tokens, limit) in enumerate(zip(draft.tokens, lengths)):
        deepest = len(tokens) if draft.is_chain else max((draft.depth(b, i) for i in range(len(tokens))), default=0)
        if deepest > limit:
            raise RuntimeError(f"the {name} drafter proposed {deepest} tokens on a path of row {b}, at most {limit} "
                               "allowed")
        if any(not 0 <= t < vocab for t in tokens):
            raise RuntimeError(f"the {name} drafter proposed a token outside [0, {vocab}) for row {b}")
