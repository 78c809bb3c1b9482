"""The speculative decoding loop: draft γ tokens, verify them with one target forward, repeat.

Per step and row (the target cache holds every committed token but the last, t0):

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
accept different numbers of tokens; the next forward is ragged. Mirostat cannot be honoured (its
state follows the surprise of each token under the distribution it was drawn from, which a draft
changes) and raises.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_flops
from metagen.decoding.prompts import Prompt
from metagen.decoding.records import token_records
from metagen.decoding.result import GenerationResult
from metagen.decoding.rows import Row
from metagen.decoding.sample_loop import StreamEvent
from metagen.sampling import NO_OPINION, LogitsProcessor, SamplerChain, SamplingParams, StopVerdict
from metagen.speculative.block_verify import block_verify
from metagen.speculative.drafters import Draft, Drafter
from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import greedy_verify

VERIFY_RULES = {"token": token_verify, "block": block_verify}
ADAPTIVE_MAX_DRAFT = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens to draft and how to verify them.

    num_draft_tokens: γ, draft tokens per step (the starting value when `adaptive`).
    verify: "token" (Leviathan et al.) or "block" (Sun et al.); temperature 0 always uses
        greedy verification (longest prefix matching the target's argmax).
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
        if self.verify not in VERIFY_RULES:
            raise ValueError(f"verify={self.verify!r} is not a rule: choose one of {', '.join(VERIFY_RULES)}")
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


def check_compatible(model, drafter: Drafter, params: SamplingParams) -> None:
    """Raise ValueError when the drafter or the sampling parameters cannot be used together."""
    if params.uses_mirostat:
        raise ValueError(
            f"mirostat_tau={params.mirostat_tau!r} cannot be used with speculative decoding: "
            "Mirostat's state follows each token's surprise under the distribution it was drawn "
            "from, which drafting changes (use plain decoding)"
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
    check_compatible(model, drafter, params)
    started = time.perf_counter()
    gamma_most = config.max_draft_tokens if config.adaptive else config.num_draft_tokens
    batch = RowBatch.for_prompt(model, prompt, params, processors, chat=chat, generator=generator,
                                positions=gamma_most + 1)
    prompt_ids, chain, generator, rows = batch.prompt_ids, batch.chain, batch.generator, batch.rows
    n, vocab = params.n, model.vocab_size
    max_new = batch.rules.max_new_tokens
    result = batch.fill(result if result is not None else GenerationResult([], prompt_ids))
    cost = result.cost = batch.prefill_cost()
    emitter = _Emitter(rows, params)

    cache, out = batch.prefill()
    drafter.start(prompt_ids, n, target_cache=cache)
    batch.followers.append(drafter)
    cost.flops += drafter.prefill_flops
    result.prefill_seconds = time.perf_counter() - started
    decode_start = time.perf_counter()
    processed = chain.process(out.logits)
    tokens = chain.choose(processed, generator)
    chain.accept(tokens)
    contexts = [list(prompt_ids) for _ in range(n)]  # per completion: prompt + committed tokens
    for b, token in enumerate(tokens.tolist()):
        yield from emitter.emit(b, [token], out.logits[b : b + 1], processed[b : b + 1], [chain.stop_verdict(b)])
        contexts[b].append(token)
    gammas = [config.num_draft_tokens] * n  # per completion: its next draft length

    while True:
        keep = batch.live()
        if not keep:
            break
        batch.keep(keep)
        active = batch.active
        row_contexts = [contexts[index] for index in active]
        lengths = [max(0, min(gammas[index], max_new - len(rows[index].completion.token_ids) - 1))
                   for index in active]
        draft = drafter.propose(row_contexts, lengths, chain, generator)
        _check_draft(draft, lengths, vocab, drafter.name)
        cost.model_calls += draft.calls
        cost.flops += draft.flops
        before = cache.lengths
        feed = [[context[-1]] + draft.tokens[b] for b, context in enumerate(row_contexts)]
        out = model.forward(cache, feed, logits="all")  # (B, T, V)
        cost.model_calls += 1
        processed, followed, verdicts = _process_positions(chain, out.logits, draft.tokens)
        outcomes = [_verify(params, config, proposed, draft.probs[b], processed[b, : len(proposed) + 1],
                            vocab, chain, generator) for b, proposed in enumerate(draft.tokens)]
        # The chain followed each draft as far as `followed[b]`: keep tau tokens of it, add x.
        chain.rollback(torch.tensor([f - tau for f, (tau, _) in zip(followed, outcomes)], dtype=torch.long))
        chain.accept(torch.tensor([token for _, token in outcomes], dtype=torch.long))
        for b, index in enumerate(active):
            proposed, (tau, token) = draft.tokens[b], outcomes[b]
            cost.flops += forward_flops(model, before[b], len(feed[b]))
            emitted = proposed[:tau] + [token]
            cost.draft_tokens += len(proposed)
            cost.accepted_tokens += tau
            cost.target_steps += 1
            cache.truncate(b, before[b] + 1 + tau)
            gammas[index] = config.next_length(gammas[index], len(proposed), tau)
            row_verdicts = verdicts[b][:tau] + [chain.stop_verdict(b)] if chain.judges_stop else None
            pushed = yield from emitter.emit(index, emitted, out.logits[b], processed[b], row_verdicts)
            contexts[index].extend(emitted[:pushed])

    drafter.finish([row.completion.token_ids for row in rows])
    result.decode_seconds = time.perf_counter() - decode_start
    batch.finish_cost(result, started)


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


class _Emitter:
    """Pushes verified tokens into their rows with the same per-token records as plain decoding."""

    def __init__(self, rows: list[Row], params: SamplingParams) -> None:
        self.rows, self.params = rows, params

    def emit(self, index: int, tokens: list[int], logits: torch.Tensor, processed: torch.Tensor,
             verdicts: list[StopVerdict] | None):
        """Push `tokens` (logits / processed rows at the same positions; the processors' verdict
        after each token, None: no opinion) until the row stops; yields StreamEvents, returns how
        many tokens were pushed."""
        row, count = self.rows[index], len(tokens)
        ids = torch.tensor(tokens, dtype=torch.long)
        records = token_records(logits[:count], ids, None if self.params.greedy else processed[:count],
                                self.params.logprobs or 0)
        for j, token in enumerate(tokens):
            text = row.push(token, records[j], verdicts[j] if verdicts is not None else NO_OPINION)
            finish = row.completion.finish_reason
            if text or finish:
                yield StreamEvent(index, text, token, finish)
            if finish is not None:
                return j + 1
        return count


def _check_draft(draft: Draft, lengths: list[int], vocab: int, name: str) -> None:
    if len(draft.tokens) != len(lengths) or len(draft.probs) != len(lengths):
        raise RuntimeError(f"the {name} drafter returned {len(draft.tokens)} rows, expected {len(lengths)}")
    for b, (tokens, limit) in enumerate(zip(draft.tokens, lengths)):
        if len(tokens) > limit:
            raise RuntimeError(f"the {name} drafter proposed {len(tokens)} tokens for row {b}, at most {limit} allowed")
        if any(not 0 <= t < vocab for t in tokens):
            raise RuntimeError(f"the {name} drafter proposed a token outside [0, {vocab}) for row {b}")


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
