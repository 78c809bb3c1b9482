"""Draw verification: keep a draft while plain decoding's own draw equals it.

At position j of the forward over `[t0, d_1..d_γ]` (row b; j = 0 predicts the token after t0):

    for j = 0, 1, ...  over the rows still following their draft:
        q_j = chain.process(logits[:, j])            # the chain sees the tokens drawn so far
        x_j = chain.choose(q_j, generator)           # exactly plain decoding's draw (argmax when greedy)
        chain.accept(x_j); push x_j into the row
        the row follows on while x_j == d_{j+1} (and it has not finished); else x_j ends its step
    (tau, x) = (tokens followed, the last x_j)

Law: every pushed token is a draw from q given the row's prefix, made as plain decoding makes
it, so the outputs follow plain decoding's law exactly, for any draft; the draft only decides
how many positions one forward scores. A token the chain removes (a ban, a truncation, a
constraint) is never drawn, so nothing is emitted that the chain forbids. Stateful processors
(penalties, constraints, Mirostat, whose state follows each drawn token's surprise) see each
row's tokens as they would there: nothing to roll back.

Seeds: when the drafter draws no random numbers (a deterministic function of the context:
forced runs, n-gram and prompt-lookup drafts), one row (n = 1) makes exactly plain decoding's
draws in its order, so a seeded request gives plain decoding's tokens. n > 1 rows share the
generator, one `chain.choose` per position over the rows still following: a row that keeps its
draft draws its next tokens before the rows that left theirs draw again, where plain decoding
draws token k of every live row in one call. Their tokens then follow the same law but not the
same seeded values (no order can match plain decoding's without knowing in advance which rows
will have finished).

Against the token / block rules (`metagen.speculative`): for a point-mass draft the chance to
keep d is q(d) under both (min(1, q(d)/p(d)) with p(d) = 1), so the acceptance is the same,
and a seed's draws are plain decoding's (the rules spend a uniform per accepted token, so their
seeded tokens differ from plain decoding's even for one row). For a sampled draft the rules keep
more (min(1, q/p) ≥ q(d) when p(d) < 1): use them there.

Cost: per position the chain runs over the whole batch (a constraint mask per row), one draw
over the rows still following; processing stops at the first position no row follows. O(T·B·V)
for T positions at most.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.drafts import Draft, Outcomes, Verification
from metagen.decoding.records import token_records
from metagen.decoding.result import StreamEvent

__all__ = ["DrawVerification"]


class DrawVerification(Verification):
    """Draws every token from the chain's distribution; keeps the draft while the draw equals it."""

    spare = 0  # a row stops drawing where it ends, so a draft may fill its whole budget

    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        draft.require_chain("draw verification")
        chain, params, size, drafts = batch.chain, batch.params, len(batch.active), draft.tokens
        followed, last = [0] * size, [0] * size
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
                last[b] = token
                if finish is None and j < len(drafts[b]) and token == drafts[b][j]:
                    followed[b] += 1
                    still.append(b)
            going = still
            if not going:
                break
        return list(zip(followed, last))
