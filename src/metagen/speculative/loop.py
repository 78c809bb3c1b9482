"""Speculative decoding: a drafter's tokens verified by the target, in the one speculative loop.

The loop itself is `metagen.decoding.draft_loop` (jump-forward runs in it too); this module
chooses its verification and checks what it is given. Per step and row (the target cache holds
every committed token but the last, t0), with the token / block rules:

    d_1..d_γ, p   = drafter.propose(context)                 # p: draft distributions (or point masses)
    logits        = target.forward(cache, [t0, d_1..d_γ], logits="all")     # (γ+1) positions
    q             = chain.process(logits) per position, chain.accept(d_j) between positions
    tau, x        = rule(d, p, q)                            # token / block / greedy verification
    cache.truncate(row, old + 1 + tau);  chain.rollback(γ − tau);  chain.accept(x)
    emit d_1..d_tau, x                                       # through the row's bookkeeping (rows.py)

The same sampler chain (bias, penalties, n-gram blocking, temperature, truncations, constraints)
produces p in the drafter and q here, so the verification rules make the emitted tokens follow
exactly the distribution plain decoding samples from; the chain's state follows the cache, so a
rejected draft token is rolled back where the cache is truncated. A draft token the chain removes
(q = 0) is rejected by every rule, so the chain stops following that row's draft there. Rows
accept different numbers of tokens; the next forward is ragged. Under the rules Mirostat cannot
be honoured (its state follows the surprise of each token under the distribution it was drawn
from, which a draft changes) and raises.

`verify="draw"` (`decoding.draw_verify`) instead draws each token from q as plain decoding
does and keeps the draft while the draw equals it: the same law, Mirostat included, and for a
drafter that draws no random numbers (n-gram) and one row, plain decoding's seeded tokens; the
acceptance of a point-mass draft is q(d) under every rule, so it costs nothing there, while a
sampled draft is kept less often (q(d) instead of min(1, q(d)/p(d))).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.draft_loop import draft_stream
from metagen.decoding.drafts import Draft, Drafter, Outcomes, Verification
from metagen.decoding.draw_verify import DrawVerification
from metagen.decoding.prompts import Prompt
from metagen.decoding.records import token_records
from metagen.decoding.result import GenerationResult, StreamEvent
from metagen.sampling import NO_OPINION, LogitsProcessor, SamplerChain, SamplingParams, StopVerdict
from metagen.speculative.block_verify import block_verify
from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import greedy_verify

VERIFY_RULES = {"token": token_verify, "block": block_verify}
VERIFY_CHOICES = (*VERIFY_RULES, "draw")
ADAPTIVE_MAX_DRAFT = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens to draft and how to verify them.

    num_draft_tokens: γ, draft tokens per step (the starting value when `adaptive`).
    verify: "token" (Leviathan et al.) or "block" (Sun et al.), where temperature 0 uses greedy
        verification (longest prefix matching the target's argmax); or "draw": each token drawn
        from the target as plain decoding draws it, the draft kept while the draw equals it
        (`decoding.draw_verify`) — for one row and a drafter that draws no random numbers
        (n-gram) the seeded output is plain decoding's, and Mirostat is allowed; a point-mass
        draft is kept with the same chance q(d) as under the rules, a sampled draft less often.
    adaptive: per row, γ grows by 2 after a fully accepted draft and shrinks by 1 after a
        rejection, within [1, max_draft_tokens].
    max_draft_tokens: the adaptive upper bound.
    """

    num_draft_tokens: int = 4
    verify: str = "token"
    adaptive: bool = False
    max_draft_tokens: int = ADAPTIVE_MAX_DRAFT

    def __post_init__(self) -> None:
        for name in ("num_draft_tokens", "max_draft_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.verify not in VERIFY_CHOICES:
            raise ValueError(f"verify={self.verify!r} is not a rule: choose one of {', '.join(VERIFY_CHOICES)}")
        if self.adaptive and self.max_draft_tokens < self.num_draft_tokens:
            raise ValueError(
                f"max_draft_tokens={self.max_draft_tokens} is below num_draft_tokens={self.num_draft_tokens}"
            )

    def next_length(self, gamma: int, proposed: int, accepted: int) -> int:
        """The row's draft length for the next step."""
        if not self.adaptive or proposed == 0:
            return gamma
        if accepted == proposed:
            return min(gamma + 2, self.max_draft_tokens)
        return max(gamma - 1, 1)


def check_compatible(model, drafter: Drafter, params: SamplingParams, config: SpeculativeConfig | None = None) -> None:
    """Raise ValueError when the drafter, the sampling parameters and the verification cannot be
    used together."""
    if params.uses_mirostat and (config is None or config.verify != "draw"):
        raise ValueError(
            f"mirostat_tau={params.mirostat_tau!r} cannot be used with speculative decoding's token / block "
            "rules: Mirostat's state follows each token's surprise under the distribution it was drawn "
            "from, which drafting changes (use plain decoding or verify='draw')"
        )
    if drafter.vocab_size is not None and drafter.vocab_size != model.vocab_size:
        raise ValueError(
            f"the {drafter.name} drafter's vocabulary has {drafter.vocab_size} tokens, the target's "
            f"{model.vocab_size}: drafter and target must share a tokenizer"
        )


def speculative_stream(
    model,
    drafter: Drafter,
    prompt: Prompt,
    params: SamplingParams | None = None,
    config: SpeculativeConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    result: GenerationResult | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> Iterator[StreamEvent]:
    """`metagen.decoding.stream` with speculative decoding; same events, same completions.

    `result.cost` receives model calls (target and drafter), FLOPs, draft and accepted tokens
    and target steps (so `cost.acceptance_rate` and `cost.block_efficiency`). `processors` as
    in `stream`: they mask draft and target alike and are rolled back with rejected drafts.
    """
    params = params or SamplingParams()
    config = config or SpeculativeConfig()
    check_compatible(model, drafter, params, config)
    started = time.perf_counter()
    gamma_most = config.max_draft_tokens if config.adaptive else config.num_draft_tokens
    batch = RowBatch.for_prompt(model, prompt, params, processors, chat=chat, generator=generator,
                                positions=gamma_most + 1)
    result = batch.fill(result if result is not None else GenerationResult([], batch.prompt_ids))
    verification = DrawVerification() if config.verify == "draw" else RuleVerification(config)
    yield from draft_stream(batch, drafter, verification, result, started, config)


def speculative_generate(
    model,
    drafter: Drafter,
    prompt: Prompt,
    params: SamplingParams | None = None,
    config: SpeculativeConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> GenerationResult:
    """`params.n` completions of `prompt` by speculative decoding (see `speculative_stream`)."""
    result = GenerationResult([], [])
    for _ in speculative_stream(model, drafter, prompt, params, config, chat=chat, generator=generator, result=result,
                                processors=processors):
        pass
    return result


class RuleVerification(Verification):
    """The token / block rules (greedy verification at temperature 0) over each row's positions,
    all processed first (`_process_positions`); the chain is then rolled back to the tokens kept
    and each row takes d_1..d_tau and x, row after row."""

    spare = 1  # a rule always draws a token after the accepted ones

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def verify(self, batch: RowBatch, logits: torch.Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        chain, params, vocab = batch.chain, batch.params, batch.model.vocab_size
        processed, followed, verdicts = _process_positions(chain, logits, draft.tokens)
        outcomes = [_verify(params, self.config, proposed, draft.probs[b], processed[b, : len(proposed) + 1],
                            vocab, chain, batch.generator) for b, proposed in enumerate(draft.tokens)]
        # The chain followed each draft as far as `followed[b]`: keep tau tokens of it, add x.
        chain.rollback(torch.tensor([f - tau for f, (tau, _) in zip(followed, outcomes)], dtype=torch.long))
        chain.accept(torch.tensor([token for _, token in outcomes], dtype=torch.long))
        for b, (proposed, (tau, token)) in enumerate(zip(draft.tokens, outcomes)):
            row_verdicts = verdicts[b][:tau] + [chain.stop_verdict(b)] if chain.judges_stop else None
            yield from _emit(batch, b, proposed[:tau] + [token], logits[b], processed[b], row_verdicts)
        return outcomes


def _emit(batch: RowBatch, b: int, tokens: list[int], logits: torch.Tensor, processed: torch.Tensor,
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


def _verify(params, config, proposed, probs, processed, vocab, chain, generator) -> tuple[int, int]:
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
    tau, token = VERIFY_RULES[config.verify](draft, probs, q, generator)
    return int(tau), int(token)
