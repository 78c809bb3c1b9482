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
from collections.abc import Iterator

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_cost
from metagen.decoding.draw_verify import DrawVerification
from metagen.decoding.drafts import Draft, Drafter, DraftSchedule, Verification
from metagen.decoding.prompt_cache import PromptCache
from metagen.decoding.result import GenerationResult, StreamEvent

__all__ = ["check_draft", "draft_stream"]


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
    model, chain, generator, rows = batch.model, batch.chain, batch.generator, batch.rows
    n, max_new = batch.params.n, batch.rules.max_new_tokens
    cache, out = batch.prefill(prompt_cache)
    cost = result.cost = batch.prefill_cost()
    drafter.start(batch.prompt_ids, n, target_cache=cache)
    batch.followers.append(drafter)
    cost.flops += drafter.prefill_flops
    result.prefill_seconds = time.perf_counter() - started
    decode_start = time.perf_counter()
    no_draft = Draft.chain([[] for _ in range(n)])
    if batch.prompt_ids:
        drafter.observe([[batch.prompt_ids[-1]]] * n, out.logits[:, None])  # (n, 1, V): after the prompt
    first = yield from DrawVerification().verify(batch, out.logits[:, None], no_draft)  # plain decoding's step
    contexts = [list(batch.prompt_ids) + [x] for _, x in first]  # per completion: prompt + committed tokens
    gammas = [schedule.num_draft_tokens if schedule is not None else max_new] * n  # per completion

    while True:
        keep = batch.live()
        if not keep:
            break
        batch.keep(keep)
        active = batch.active
        row_contexts = [contexts[index] for index in active]
        lengths = [max(0, min(gammas[index], max_new - len(rows[index].completion.token_ids) - verification.spare))
                   for index in active]
        draft = drafter.propose(row_contexts, lengths, chain, generator)
        check_draft(draft, lengths, model.vocab_size, drafter.name, trees=verification.trees)
        cost.model_calls += draft.calls
        cost.flops += draft.flops
        before = cache.lengths
        feed = [[context[-1]] + draft.tokens[b] for b, context in enumerate(row_contexts)]
        cost += forward_cost(model, before, [len(tokens) for tokens in feed])
        if draft.is_chain:
            tree = None
            out = model.forward(cache, feed, logits="all", hidden=drafter.reads_hidden)  # logits (B, 1 + γ, V)
        else:  # t0 is the root: node i is fed at 1 + i, its parent at 1 + parents[i]
            tree = [[-1] + [parent + 1 for parent in parents] for parents in draft.parents]
            out = model.forward(cache, feed, logits="all", hidden=drafter.reads_hidden, tree=tree)  # (B, 1 + nodes, V)
        logits = out.logits
        outcomes = yield from verification.verify(batch, logits, draft)
        kept: list[tuple[list[int], int]] = []  # per row: the kept path's nodes, the token after it
        for b, (index, proposed, outcome) in enumerate(zip(active, draft.tokens, outcomes)):
            tau, token = outcome[0], outcome[1]
            nodes = outcome[2] if len(outcome) > 2 else range(tau)  # the kept path's nodes
            if drafter.forced:
                result.forced_tokens += tau
            else:
                cost.draft_tokens += len(proposed)
                cost.accepted_tokens += tau
            if tree is not None:  # keep t0 and the path, release the other nodes
                batch.keep_path(b, before[b], [0] + [1 + i for i in nodes])
            elif tau < len(proposed):
                batch.truncate(b, before[b] + 1 + tau)
            if schedule is not None:
                deepest = max((draft.depth(b, i) for i in range(len(proposed))), default=0)
                gammas[index] = schedule.next_length(gammas[index], deepest, tau)
            contexts[index] += [proposed[i] for i in nodes] + [token]
            kept.append((list(nodes), token))
        drafter.observe(feed, logits, kept)
        if drafter.reads_hidden:
            drafter.observe_hidden(out.hidden, kept)  # (B, 1 + most nodes, H)

    drafter.finish([row.completion.token_ids for row in rows])
    result.decode_seconds = time.perf_counter() - decode_start
    batch.finish_cost(result, started)


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
