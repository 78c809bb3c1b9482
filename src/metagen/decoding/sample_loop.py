"""The sampling loop: prefill once, fork into n rows, decode the batch until each row stops.

One step (nanoGPT / gpt-fast style), the whole loop on one screen in `stream`:

    logits, cost = batch.forward(last_tokens, starts) # (B, V), raw model logits (every model's forward)
    scores = batch.scores(logits)                     # the logits, or a combiner's scores (B, V)
    processed = chain.process(scores)                 # logits processors, (B, V)
    tokens = chain.choose(processed, generator)       # greedy or a draw, (B,)
    chain.accept(tokens)                              # penalty / n-gram / mirostat / constraint state
    batch.push(b, token, record)                      # per row: text, records, stop checks
    batch.keep(batch.live())                          # finished rows leave: cache, chain, rows

Rows stop as `decoding.rows` says (EOS unless `ignore_eos`, a `stop_token_ids` token, a stop
string, a processor ending the row, `max_tokens`, the model's context). Finished rows leave the
batch (`RowBatch.keep`: the cache and the processors' state follow), so the batch shrinks.

Jump-forward (`jump_forward=True`, the default): when a processor may force runs of tokens (a
constraint), the rows decode in the speculative loop (`draft_loop`) instead, the forced run as
a point-mass draft (`jump_forward.ForcedRunDrafter`) kept while plain decoding's own draw equals
it (`draw_verify`): the law of this loop (for one row, its seeded tokens), in fewer forwards.
`GenerationResult.forced_tokens` counts the run tokens taken.

Several models (`combiner=`, a `decoding.combine.LogitsCombiner` such as `ContrastiveConfig`):
the batch runs the combiner's companions on the same rows (`RowBatch`), and the chain processes
the combined scores instead of the model's logits; records keep the model's own log-probs.
Jump-forward is not used then (the plain loop, the same output law).

AdaDec (`rerank=`, a `decoding.adadec.AdaDecConfig`): after the choice, the rows whose
next-token entropy is above τ rerank their top candidates by a short greedy lookahead on forks
of their rows (`adadec.adadec_step`, between `choose` and `accept`); its forwards join the
step's cost and `result.lookahead_steps` counts the rows that paused. One model only (no
combiner), the plain loop (no jump-forward).

Cost: the loop fills `result.cost` as it spends it — the prefill (`RowBatch.prefill_cost`: the
prompt computed once and reused by the n − 1 forked rows) and each forward (`cost.forward_cost`:
one model call, the FLOPs of each row's fed token at its position, one target step per row),
then generated tokens and wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from metagen.decoding.adadec import AdaDecConfig, adadec_step
from metagen.decoding.batch import RowBatch
from metagen.decoding.combine import LogitsCombiner
from metagen.decoding.draft_loop import draft_stream
from metagen.decoding.draw_verify import DrawVerification
from metagen.decoding.jump_forward import ForcedRunDrafter
from metagen.decoding.prompt_cache import PromptCache
from metagen.decoding.prompts import Prompt
from metagen.decoding.records import token_records
from metagen.decoding.result import GenerationResult, StreamEvent
from metagen.sampling import LogitsProcessor, SamplingParams

__all__ = ["StreamEvent", "generate", "generate_batch", "stream"]


def stream(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    result: GenerationResult | None = None,
    processors: Sequence[LogitsProcessor] = (),
    jump_forward: bool = True,
    prompt_cache: PromptCache | None = None,
    combiner: LogitsCombiner | None = None,
    rerank: AdaDecConfig | None = None,
) -> Iterator[StreamEvent]:
    """Decode `params.n` completions of `prompt` as one batch, yielding text as it is produced.

    The prompt is prefilled once and the cache forked into n rows. `generator` overrides
    `params.seed`; with neither, sampling draws from a fresh unseeded generator. Pass a
    `GenerationResult` as `result` to receive the completions and their `Cost` when the stream
    ends.
    `processors`: extra logits processors run first (constraints), each given with its state
    after the prompt for one row; they are forked into the n rows, the given objects untouched.
    `jump_forward`: feed the runs of tokens a processor forces in one forward (module docstring);
    the output law is the same either way.
    `params.token_healing`: see `rows.heal_request` (the text returned excludes the healed part).
    `prompt_cache`: reuse the last prompt's keys and values when these prompt ids are the same
    (`PromptCache`; the outputs are a fresh prefill's, the cost counts the prompt as reused).
    `combiner`: next-token scores from the model and the combiner's companion models run on the
    same rows (`ContrastiveConfig(amateur, alpha, amateur_temperature)`: contrastive decoding;
    `DExpertsConfig(expert, anti_expert, alpha)`: DExperts / proxy tuning;
    `EntropyAdaptiveConfig(large, threshold, window)`: the large model's logits for the rows where
    the model's rolling entropy is high, `result.model_tokens` counting each model's tokens);
    the sampler chain (temperature, truncation, penalties, constraints) then acts on them.
    `rerank`: AdaDec (`AdaDecConfig(threshold, candidates, lookahead)`): rows whose entropy is
    above τ bits take the best of their top candidates by a greedy lookahead (`decoding.adadec`);
    not with `combiner` (ValueError).
    """
    started = time.perf_counter()
    params = params or SamplingParams()
    if rerank is not None and combiner is not None:
        raise ValueError("rerank (AdaDec) cannot be combined with a combiner: its lookahead runs the one model")
    held, what = (None, "n") if rerank is None else (params.n * (rerank.candidates + 1), "n·(candidates + 1)")
    batch = RowBatch.for_prompt(model, prompt, params, processors, chat=chat, generator=generator, combiner=combiner,
                                forward_rows=held, what=what)  # AdaDec: the n rows held aside and their lookahead
    result = batch.fill(result if result is not None else GenerationResult([], batch.prompt_ids))
    if jump_forward and batch.chain.judges_stop and combiner is None and rerank is None:  # forced runs as drafts
        yield from draft_stream(batch, ForcedRunDrafter(), DrawVerification(), result, started,
                                prompt_cache=prompt_cache)
        return
    chain, generator, records_top = batch.chain, batch.generator, params.logprobs or 0

    _, out = batch.prefill(prompt_cache)
    cost = result.cost = batch.prefill_cost()
    position = len(batch.prompt_ids)  # where every row's next fed token goes
    result.prefill_seconds = time.perf_counter() - started
    logits = out.logits  # (B, V)
    decode_start = time.perf_counter()
    while True:
        processed = chain.process(batch.scores(logits))  # (B, V)
        tokens = chain.choose(processed, generator)  # (B,)
        if rerank is not None:  # AdaDec: uncertain rows rerank their candidates by a lookahead
            tokens, step_cost, paused = adadec_step(batch, logits, processed, tokens, position, rerank)
            cost += step_cost
            result.lookahead_steps += paused
        chain.accept(tokens)
        records = token_records(logits, tokens, None if params.greedy else processed, records_top)
        chosen = tokens.tolist()
        for b, token in enumerate(chosen):
            text = batch.push(b, token, records[b])
            finish = batch.row(b).completion.finish_reason
            if text or finish:
                yield StreamEvent(batch.active[b], text, token, finish)
        keep = batch.live()
        if not keep:
            break
        batch.keep(keep)
        logits, step_cost = batch.forward(torch.tensor([chosen[b] for b in keep])[:, None],
                                          [position] * len(keep))  # (B, V); rows are all at one position
        cost += step_cost
        position += 1
    result.decode_seconds = time.perf_counter() - decode_start
    batch.finish_cost(result, started)


def generate(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
    jump_forward: bool = True,
    prompt_cache: PromptCache | None = None,
    combiner: LogitsCombiner | None = None,
    rerank: AdaDecConfig | None = None,
) -> GenerationResult:
    """Generate `params.n` completions of `prompt` (text, chat messages or token ids); `combiner`
    and `rerank`: see `stream` (contrastive decoding: `combiner=ContrastiveConfig(amateur=
    small_model)`; AdaDec: `rerank=AdaDecConfig(threshold=2.0)`)."""
    result = GenerationResult([], [])
    for _ in stream(model, prompt, params, chat=chat, generator=generator, result=result, processors=processors,
                    jump_forward=jump_forward, prompt_cache=prompt_cache, combiner=combiner, rerank=rerank):
        pass
    return result


def generate_batch(
    model,
    prompts: Sequence[Prompt],
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
    jump_forward: bool = True,
) -> list[GenerationResult]:
    """`generate` for several prompts, one after another, sharing one generator (and starting
    each from the same given `processors`)."""
    params = params or SamplingParams()
    if generator is None and params.seed is not None:
        generator = params.make_generator()
    return [generate(model, prompt, params, chat=chat, generator=generator, processors=processors,
                     jump_forward=jump_forward)
            for prompt in prompts]
