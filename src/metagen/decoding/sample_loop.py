"""The sampling loop: prefill once, fork into n rows, decode the batch until each row stops.

One step (nanoGPT / gpt-fast style):

    logits = model.forward(cache, last_tokens)        # (B, V), raw model logits
    processed = chain.process(logits)                 # logits processors, (B, V)
    tokens = chain.choose(processed, generator)       # greedy or a draw, (B,)
    chain.accept(tokens)                              # penalty / n-gram / mirostat / constraint state
    row.push(token, record, chain.stop_verdict(b))    # per row: text, records, stop checks

Rows stop as `decoding.rows` says (EOS unless `ignore_eos`, a `stop_token_ids` token, a stop
string, a processor ending the row, `max_tokens`, the model's context). Finished rows leave the
batch (`cache.select`, and `chain.select` for the processors' state), so the batch shrinks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from metagen.decoding.cost import Cost
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.rows import Completion, Row, StopRules, request_chain, token_records
from metagen.sampling import LogitsProcessor, SamplingParams

__all__ = ["Completion", "GenerationResult", "StreamEvent", "generate", "generate_batch", "stream"]


@dataclass
class GenerationResult:
    """Completions for one prompt plus counts and timing (`cost` is set by a `Generator`).

    prompt_token_ids: None when unknown (a remote server given text or chat messages)."""

    completions: list[Completion]
    prompt_token_ids: list[int]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    model_calls: int = 0
    cost: Cost | None = None

    @property
    def generated_tokens(self) -> int:
        """Tokens generated over all completions (from `cost` when some ids are unknown, as from a
        server that returns no token ids: their `token_ids` is None)."""
        if any(c.token_ids is None for c in self.completions):
            if self.cost is None:
                raise ValueError("token ids are unknown and no cost was recorded: generated tokens unknown")
            return self.cost.generated_tokens
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def text(self) -> str:
        return self.completions[0].text


@dataclass
class StreamEvent:
    """A piece of output: `text` newly safe to show for completion `index` (after `token_id`)."""

    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None


def stream(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    result: GenerationResult | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> Iterator[StreamEvent]:
    """Decode `params.n` completions of `prompt` as one batch, yielding text as it is produced.

    The prompt is prefilled once and the cache forked into n rows. `generator` overrides
    `params.seed`; with neither, sampling draws from a fresh unseeded generator. Pass a
    `GenerationResult` as `result` to receive the completions when the stream ends.
    `processors`: extra logits processors run first (constraints), each given with its state
    after the prompt for one row; they are forked into the n rows, the given objects untouched.
    """
    params = params or SamplingParams()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    rules = StopRules.from_params(params, model, len(prompt_ids))
    if generator is None:
        generator = params.make_generator()  # seeded, or fresh OS entropy (torch's global RNG is left alone)
    n = params.n
    check_batch_fits(model, n, rules.max_new_tokens)  # before any per-row state is allocated
    chain = request_chain(params, model, prompt_ids, n, processors)
    rows = [Row(model.tokenizer, prompt_ids, rules, want_top=bool(params.logprobs)) for _ in range(n)]
    result = result if result is not None else GenerationResult([], prompt_ids)
    result.prompt_token_ids = prompt_ids
    result.completions = [row.completion for row in rows]

    start = time.perf_counter()
    cache, out = model.prefill(prompt_ids, batch_size=n)
    result.prefill_seconds = time.perf_counter() - start
    result.model_calls += 1
    active = list(range(n))  # completion index of each cache row
    decode_start = time.perf_counter()
    while active:
        logits = out.logits  # (B, V)
        processed = chain.process(logits)
        tokens = chain.choose(processed, generator)
        chain.accept(tokens)
        records = token_records(logits, tokens, None if params.greedy else processed, params.logprobs or 0)
        keep: list[int] = []
        for b, (index, token) in enumerate(zip(active, tokens.tolist())):
            text = rows[index].push(token, records[b], chain.stop_verdict(b))
            finish = rows[index].completion.finish_reason
            if finish is None:
                keep.append(b)
            if text or finish:
                yield StreamEvent(index, text, token, finish)
        if not keep:
            break
        if len(keep) < len(active):
            cache.select(keep)
            chain.select(torch.tensor(keep, dtype=torch.long))
            tokens = tokens[keep]
            active = [active[b] for b in keep]
        out = model.forward(cache, tokens[:, None])
        result.model_calls += 1
    result.decode_seconds = time.perf_counter() - decode_start


def generate(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> GenerationResult:
    """Generate `params.n` completions of `prompt` (text, chat messages or token ids)."""
    result = GenerationResult([], [])
    for _ in stream(model, prompt, params, chat=chat, generator=generator, result=result, processors=processors):
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
) -> list[GenerationResult]:
    """`generate` for several prompts, one after another, sharing one generator (and starting
    each from the same given `processors`)."""
    params = params or SamplingParams()
    if generator is None and params.seed is not None:
        generator = params.make_generator()
    return [generate(model, prompt, params, chat=chat, generator=generator, processors=processors)
            for prompt in prompts]
