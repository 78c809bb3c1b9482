"""The token / block rules as the speculative loop's `Verification` (greedy at temperature 0).

Per step, over the live rows (`logits (B, 1 + longest draft, V)`, each row's draft a chain):

    processed, followed = chain.process at every position, accepting each draft token in turn
    tau_b, x_b = rule(d_b, p_b, softmax(processed_b))      # greedy_verify when params.greedy
    chain.rollback(followed − tau);  chain.accept(x);  push d_1..d_tau, x into each row

A deterministic draft (probs None) is a point mass on each token. The chain processes every
draft position before any rule runs, so penalties, n-gram bans and constraints see each draft
token as plain decoding would; a token the chain removes (q = 0) ends what the chain follows,
and every rule rejects it there. Cost: O(B·γ·V) for the chain and the rule, one Python loop over
positions only when the chain holds state.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.drafts import Draft, Outcomes, Verification
from metagen.decoding.records import token_records
from metagen.decoding.result import StreamEvent
from metagen.sampling import NO_OPINION, SamplerChain, StopVerdict
from metagen.speculative.verify import greedy_verify

__all__ = ["RuleVerification", "emit_row"]

# (draft (γ,), p (γ, V), q (γ+1, V), generator) -> (tau, token): token_verify, block_verify
Rule = Callable[[Tensor, Tensor, Tensor, "torch.Generator | None"], tuple[Tensor, Tensor]]


class RuleVerification(Verification):
    """The token / block rules (greedy verification at temperature 0) over each row's positions,
    all processed first (`_process_positions`); the chain is then rolled back to the tokens kept
    and each row takes d_1..d_tau and x, row after row."""

    spare = 1  # a rule always draws a token after the accepted ones

    def __init__(self, rule: Rule, name: str) -> None:
        self.rule, self.name = rule, name

    def verify(self, batch: RowBatch, logits: torch.Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        draft.require_chain(f"{self.name} verification")
        chain = batch.chain
        processed, followed, verdicts = _process_positions(chain, logits, draft.tokens)
        outcomes = self.outcomes(batch, processed, draft)
        # The chain followed each draft as far as `followed[b]`: keep tau tokens of it, add x.
        chain.rollback(torch.tensor([f - tau for f, (tau, _) in zip(followed, outcomes)], dtype=torch.long))
        chain.accept(torch.tensor([token for _, token in outcomes], dtype=torch.long))
        for b, (proposed, (tau, token)) in enumerate(zip(draft.tokens, outcomes)):
            row_verdicts = verdicts[b][:tau] + [chain.stop_verdict(b)] if chain.judges_stop else None
            yield from emit_row(batch, b, proposed[:tau] + [token], logits[b], processed[b], row_verdicts)
        return outcomes

    def outcomes(self, batch: RowBatch, processed: torch.Tensor, draft: Draft) -> list[tuple[int, int]]:
        """`(tau, x)` per row from the processed target logits `processed (B, 1 + longest draft, V)`
        (a subclass may draw x otherwise: `pearl.PearlVerification`)."""
        params, vocab, chain = batch.params, batch.model.vocab_size, batch.chain
        return [_verify(params, self.rule, proposed, draft.probs[b], processed[b, : len(proposed) + 1], vocab, chain,
                        batch.generator) for b, proposed in enumerate(draft.tokens)]


def emit_row(batch: RowBatch, b: int, tokens: list[int], logits: torch.Tensor, processed: torch.Tensor,
          verdicts: list[StopVerdict] | None) -> Iterator[StreamEvent]:
    """Push `tokens` into live row b until it stops (`logits` / `processed (T, V)` at their
    positions give the same per-token records as plain decoding; `verdicts`: the processors'
    verdict after each token, None: no opinion)."""
    row, count, params = batch.row(b), len(tokens), batch.params
    ids = torch.tensor(tokens, dtype=torch.long)
    records = token_records(logits[:count], ids, None if params.greedy else processed[:count], params.logprobs or 0)
    for j, token in enumerate(tokens):
        text = row.push(token, records[j], verdicts[j] if verdicts is not None else NO_OPINION)
        finish = row.completion.finish_reason
        if text or finish:
            yield StreamEvent(batch.active[b], text, token, finish)
        if finish is not None:
            return


def _process_positions(chain: SamplerChain, logits: torch.Tensor, drafts: list[list[int]]):
    """The chain applied at every position of `logits (B, T, V)`, position j of row b seeing the
    chain state advanced by that row's draft tokens before j.

    Returns `(processed (B, T, V), followed, verdicts)`: the chain is left advanced by the first
    `followed[b]` draft tokens of row b — all of them, or up to the first one the chain removed
    (q = 0 there, so every rule rejects it) — and `verdicts[b][j]` is the chain's stop verdict
    after row b's draft token j (empty when no processor judges stops).
    """
    batch, length, vocab = logits.shape
    verdicts: list[list[StopVerdict]] = [[] for _ in range(batch)]
    if not chain.stateful:
        processed = chain.process(logits.reshape(batch * length, vocab)).view(batch, length, vocab)
        return processed, [len(d) for d in drafts], verdicts
    followed = [0] * batch
    positions = []
    for j in range(length):
        positions.append(chain.process(logits[:, j]))
        if j + 1 == length:
            break
        column = torch.tensor([d[j] if j < len(d) and followed[b] == j else -1 for b, d in enumerate(drafts)])
        kept = positions[-1].gather(1, column.clamp(min=0)[:, None]).squeeze(1) > float("-inf")
        column = torch.where(kept, column, -1)
        chain.accept(column)
        for b, token in enumerate(column.tolist()):
            if token >= 0:
                followed[b] += 1
                if chain.judges_stop:
                    verdicts[b].append(chain.stop_verdict(b))
    return torch.stack(positions, dim=1), followed, verdicts


def _verify(params, rule: Rule, proposed, probs, processed, vocab, chain, generator) -> tuple[int, int]:
    """(tau, token) for one row; `processed (γ+1, V)` target logits after the chain."""
    gamma = len(proposed)
    draft = torch.tensor(proposed, dtype=torch.long)
    if params.greedy:
        tau, token = greedy_verify(draft, processed)
        return int(tau), int(token)
    if gamma == 0:
        return 0, int(chain.choose(processed[:1], generator)[0])
    q = torch.softmax(processed, dim=-1)
    if probs is None:  # deterministic draft: a point mass on each proposed token
        probs = torch.zeros(gamma, vocab).scatter_(1, draft[:, None], 1.0)
    tau, token = rule(draft, probs, q, generator)
    return int(tau), int(token)
