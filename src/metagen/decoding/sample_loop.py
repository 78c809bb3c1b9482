"""The sampling loop: prefill once, fork into n rows, decode the batch until each row stops.

One step (nanoGPT / gpt-fast style):

    logits = model.forward(cache, last_tokens)        # (B, V), raw model logits
    processed = chain.process(logits)                 # sampling adapters, (B, V)
    tokens = chain.choose(processed, generator)       # greedy or a draw, (B,)
    chain.update(tokens)                              # penalty / n-gram / mirostat state

Rows stop on an EOS token (unless `ignore_eos`), a `stop_token_ids` token, a stop string
(matched on text; the stop string is not part of the output), `max_tokens`, or the model's
context length. Finished rows leave the batch (`cache.select`), so the batch shrinks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from metagen.decoding.cost import Cost
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt, stop_token_set
from metagen.models.detokenize import IncrementalDetokenizer, StopStringMatcher
from metagen.sampling import SamplerChain, SamplingParams


@dataclass
class Completion:
    """One generated sequence.

    token_ids: the sampled ids; None when unknown (a server that returns no ids and no tokenizer
        given; such a generator lacks the TOKEN_IDS capability).
    logprobs: log p(token) under the model's unmodified distribution, per token.
    sampling_logprobs: log p(token) under the distribution it was drawn from (after adapters).
    top_logprobs: per token, {token_id: logprob} of the model's top `params.logprobs` tokens.
    certainties: per token, KL(uniform ‖ p) of the model's unmodified next-token distribution
        p: −log V − mean_v log p_v (self-certainty's per-token term; 0 for a uniform p).
    finish_reason: "stop" (EOS, stop token or stop string) or "length" (max_tokens / context).
    stop_reason: the stop string or token id that ended the row, if any.
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    certainties: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def cumulative_logprob(self) -> float:
        return float(sum(self.logprobs))


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


class _Row:
    """Per-completion decoding state: the completion, text assembly and stop checks."""

    def __init__(self, model, params: SamplingParams, prompt_ids: list[int], want_top: bool) -> None:
        self.completion = Completion(top_logprobs=[] if want_top else None)
        # Special tokens (chat markers, EOS kept by ignore_eos) are not part of the text.
        self.detokenizer = IncrementalDetokenizer(model.tokenizer, prompt_ids, skip_special_tokens=True)
        self.stops = StopStringMatcher(params.stop) if params.stop else None

    def push(
        self,
        token: int,
        logprob: float,
        sampled: float,
        certainty: float,
        top: dict[int, float] | None,
        is_stop_token: bool,
        at_limit: bool,
    ) -> str:
        """Record one chosen token; return the text it makes safe to show.

        Sets `completion.finish_reason` when the row ends: on a stop token, a stop string, or
        `at_limit` (max_tokens / context reached with this token).
        """
        completion = self.completion
        completion.token_ids.append(token)
        completion.logprobs.append(logprob)
        completion.sampling_logprobs.append(sampled)
        completion.certainties.append(certainty)
        if top is not None:
            completion.top_logprobs.append(top)
        last = is_stop_token or at_limit
        delta = "" if is_stop_token else self.detokenizer.push(token)  # stop tokens add no text
        if last:
            delta += self.detokenizer.flush()
        if self.stops is None:
            text, hit_stop_string = delta, False
        else:
            text, hit_stop_string = self.stops.feed(delta)
        if hit_stop_string:
            completion.finish_reason, completion.stop_reason = "stop", self.stops.matched
        elif last:
            text += self.stops.flush() if self.stops is not None else ""
            completion.finish_reason = "stop" if is_stop_token else "length"
            completion.stop_reason = token if is_stop_token else None
        completion.text += text
        return text


def stream(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    result: GenerationResult | None = None,
) -> Iterator[StreamEvent]:
    """Decode `params.n` completions of `prompt` as one batch, yielding text as it is produced.

    The prompt is prefilled once and the cache forked into n rows. `generator` overrides
    `params.seed`; with neither, sampling draws from a fresh unseeded generator. Pass a
    `GenerationResult` as `result` to receive the completions when the stream ends.
    """
    params = params or SamplingParams()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    if len(prompt_ids) >= model.max_context:
        raise ValueError(
            f"prompt has {len(prompt_ids)} tokens, the model's context is {model.max_context}: "
            "no room to generate"
        )
    if generator is None:
        generator = params.make_generator()  # seeded, or fresh OS entropy (torch's global RNG is left alone)
    n = params.n
    want_top = bool(params.logprobs)
    stop_ids = stop_token_set(params, model)
    max_new = min(params.max_tokens, model.max_context - len(prompt_ids))
    check_batch_fits(model, n, max_new)  # before any per-row state is allocated
    chain = SamplerChain.from_params(params, n, model.vocab_size, prompt_ids)
    rows = [_Row(model, params, prompt_ids, want_top) for _ in range(n)]
    result = result if result is not None else GenerationResult([], prompt_ids)
    result.prompt_token_ids = prompt_ids
    result.completions = [row.completion for row in rows]

    start = time.perf_counter()
    cache, out = model.prefill(prompt_ids, batch_size=n)
    result.prefill_seconds = time.perf_counter() - start
    result.model_calls += 1
    active = list(range(n))  # completion index of each cache row
    decode_start = time.perf_counter()
    log_vocab = math.log(model.vocab_size)
    step = 0
    while active:
        logits = out.logits  # (B, V)
        processed = chain.process(logits)
        tokens = chain.choose(processed, generator)
        chain.update(tokens)
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        chosen = raw_logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        certainties = (-log_vocab - raw_logprobs.mean(dim=-1)).tolist()
        if params.greedy:  # a point mass on the argmax
            sampled = [0.0] * len(chosen)
        else:
            sampled = torch.log_softmax(processed, dim=-1).gather(1, tokens[:, None]).squeeze(1).tolist()
        if want_top:
            top = torch.topk(raw_logprobs, params.logprobs, dim=-1)
            top_ids, top_values = top.indices.tolist(), top.values.tolist()
        step += 1
        keep: list[int] = []
        for b, (index, token) in enumerate(zip(active, tokens.tolist())):
            row = rows[index]
            top = dict(zip(top_ids[b], top_values[b])) if want_top else None
            text = row.push(token, chosen[b], sampled[b], certainties[b], top, token in stop_ids, step >= max_new)
            finish = row.completion.finish_reason
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
) -> GenerationResult:
    """Generate `params.n` completions of `prompt` (text, chat messages or token ids)."""
    result = GenerationResult([], [])
    for _ in stream(model, prompt, params, chat=chat, generator=generator, result=result):
        pass
    return result


def generate_batch(
    model,
    prompts: Sequence[Prompt],
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
) -> list[GenerationResult]:
    """`generate` for several prompts, one after another, sharing one generator."""
    params = params or SamplingParams()
    if generator is None and params.seed is not None:
        generator = params.make_generator()
    return [generate(model, prompt, params, chat=chat, generator=generator) for prompt in prompts]
