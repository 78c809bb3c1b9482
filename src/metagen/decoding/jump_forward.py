"""Jump-forward: speculative decoding with a processor's forced run as a point-mass draft.

When a processor names a run of tokens as the only continuation of a row (`SamplerChain.forced`:
a constraint's fixed text, e.g. the key `"birth_date":` of a JSON schema), the row feeds its
drawn token *and* the run in one multi-token forward (ragged over the rows, `logits="all"`):

    runs    = forced_runs(batch)                                   # the draft: d_1..d_k per row
    logits  = model.forward(cache, [[t0] + run per row], "all")    # (B, 1 + longest run, V)
    for j:  processed = chain.process(logits[:, j])                # rows still following the run
            x = chain.choose(processed, generator); chain.accept(x)
            push x; the row follows on while x == d_{j+1}, else x ends its run
    cache.truncate(row, after x)                                   # the untaken run tokens leave

The run is verified by *drawing*: at position j a token is drawn from the chain's distribution q
exactly as plain decoding draws it (argmax when greedy), and the row keeps following the run only
while the drawn token is the run's token. This is speculative verification of a point-mass draft
(accept d with probability q(d), else draw from q without d — one draw from q does both), so the
tokens follow exactly the law of plain decoding, jump-forward on or off; what changes is the
number of model forwards (one per run instead of one per token). The run is only a proposal, so
nothing is emitted that the chain forbids: a token another processor (a penalty, a ban, a
truncation) removes is simply never drawn. A run is cut where the row's budget (max_tokens, the
context) ends; stop strings and stop tokens apply to every token, and a row that ends inside a
run stops drawing there. llguidance's runs are the canonical tokenization of the forced text; a
model may prefer another split (`"na` + `me"`), which the draw then takes, ending the run.

Why this rule and not the speculative loop's token / block rules: drawing by position over the
rows still following keeps the generator's draws in the order plain decoding makes them (so a
seeded request gives the same tokens as before, and mirostat's state, which follows each drawn
token, needs no rollback), and it stops processing positions as soon as no row follows its run
(each processed position is a constraint mask). The speculative loop verifies each row after
all its positions are processed and draws its corrections from residuals.

Cost: per position of a run the chain runs over the whole batch (a mask per row), one draw per
following row; the forward of a run of k tokens costs about one decode step (fused kernels up to
16 new tokens per row). `GenerationResult.forced_tokens` counts the run tokens taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_flops
from metagen.decoding.records import token_records
from metagen.decoding.result import GenerationResult
from metagen.decoding.sample_loop import StreamEvent

__all__ = ["forced_runs", "jump_forward_stream"]


def forced_runs(batch: RowBatch) -> list[list[int]]:
    """The draft of every live row: the tokens the processors force after its last token, cut to
    its budget (max_tokens and the context, less the tokens it holds)."""
    runs = []
    for b, index in enumerate(batch.active):
        room = batch.rules.max_new_tokens - len(batch.rows[index].completion.token_ids)
        runs.append(batch.chain.forced(b)[:room] if room > 0 else [])
    return runs


def jump_forward_stream(batch: RowBatch, result: GenerationResult, started: float) -> Iterator[StreamEvent]:
    """Decode `batch` (set up, not yet prefilled) to the end with forced runs fed as drafts,
    yielding events and filling `result` and its `Cost` (from `started`, a perf_counter value) as
    `sample_loop.stream` does. A forward's FLOPs count every token fed, the run tokens a draw
    left included; a row's tokens from one forward are one target step."""
    model = batch.model
    cost = result.cost = batch.prefill_cost()
    cache, out = batch.prefill()
    result.prefill_seconds = time.perf_counter() - started
    logits, runs = out.logits[:, None], [[] for _ in batch.active]  # (B, 1, V); no run fed yet
    decode_start = time.perf_counter()
    while True:
        steps = _Steps(batch)
        yield from steps.take(logits, runs)
        result.forced_tokens += sum(steps.followed)
        if any(len(run) > taken for run, taken in zip(runs, steps.followed)):
            lengths = cache.lengths
            for b, (run, taken) in enumerate(zip(runs, steps.followed)):
                if taken < len(run):  # the draw left the run: drop its untaken tokens from the cache
                    cache.truncate(b, lengths[b] - (len(run) - taken))
        keep = [b for b, token in enumerate(steps.pending) if token is not None]
        if not keep:
            break
        batch.keep(keep)
        pending = [steps.pending[b] for b in keep]
        runs = forced_runs(batch)
        lengths = cache.lengths
        cost.flops += sum(forward_flops(model, lengths[b], 1 + len(run)) for b, run in enumerate(runs))
        cost.model_calls += 1
        cost.target_steps += len(keep)
        if any(runs):
            out = model.forward(cache, [[token] + run for token, run in zip(pending, runs)], logits="all")
            logits = out.logits  # (B, 1 + longest run, V)
        else:
            logits = model.forward(cache, torch.tensor(pending)[:, None]).logits[:, None]  # (B, 1, V)
    result.decode_seconds = time.perf_counter() - decode_start
    batch.finish_cost(result, started)


class _Steps:
    """One forward's worth of decoding for the batch: position j of `logits (B, T, V)` predicts the
    token after row b's pending token and `runs[b][:j]`; a row goes on to position j + 1 only
    while its drawn token equals its run's token (module docstring).

    After `take`: `pending[b]` is the drawn token row b feeds next (None: the row ended) and
    `followed[b]` how many tokens of its run it took."""

    def __init__(self, batch: RowBatch) -> None:
        self.batch = batch
        self.pending: list[int | None] = [None] * len(batch.active)
        self.followed = [0] * len(batch.active)

    def take(self, logits: torch.Tensor, runs: list[list[int]]) -> Iterator[StreamEvent]:
        batch = self.batch
        chain, params, size = batch.chain, batch.params, len(batch.active)
        going = list(range(size))
        for j in range(logits.shape[1]):
            processed = chain.process(logits[:, j])  # (B, V); rows not going are processed but unused
            if len(going) == size:
                position, index = logits[:, j], None
            else:
                index = torch.tensor(going, dtype=torch.long)
                position, processed = logits[index, j], processed[index]
            tokens = chain.choose(processed, batch.generator)  # (G,)
            if index is None:
                chain.accept(tokens)
            else:
                chain.accept(torch.full((size,), -1, dtype=torch.long).index_copy_(0, index, tokens))
            records = token_records(position, tokens, None if params.greedy else processed, params.logprobs or 0)
            still = []
            for g, (b, token) in enumerate(zip(going, tokens.tolist())):
                text = batch.push(b, token, records[g])
                finish = batch.row(b).completion.finish_reason
                if text or finish:
                    yield StreamEvent(batch.active[b], text, token, finish)
                if finish is not None:
                    continue
                if j < len(runs[b]) and token == runs[b][j]:
                    self.followed[b] += 1
                    still.append(b)
                else:
                    self.pending[b] = token
            going = still
            if not going:
                break
