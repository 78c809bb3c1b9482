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

Jump-forward (`jump_forward=True`, the default). When a processor names a run of tokens as the
only continuation of a row (`SamplerChain.forced`: a constraint's fixed text, e.g. the key
`"birth_date":` of a JSON schema), the row feeds its sampled token *and* the run in one
multi-token forward (ragged over the rows, `logits="all"`), and the run is then taken position
by position exactly as plain decoding would take it: at position j the chain processes the
logits of that position, a token is drawn (argmax when greedy) and accepted, and the row keeps
following the run only while the drawn token is the run's token; the first token that differs
ends the run there (the cache is truncated after it). This is speculative decoding with the
run as a point-mass draft (accept d with probability q(d), else draw from q without d — one
draw from q does both), so the tokens follow exactly the law of plain decoding, jump-forward on
or off; what changes is the number of model forwards (one per run instead of one per token).
The run is only a proposal, so nothing is emitted that the chain forbids: a token that another
processor (a penalty, a ban, a truncation) removes is simply never drawn. A run is cut where the
row's budget (max_tokens, the context) ends; stop strings and stop tokens apply to every token.
llguidance's runs are the canonical tokenization of the forced text; a model may prefer another
split (`"na` + `me"`), which the draw then takes, ending the run.
Cost: per position of a run the chain runs over the whole batch (a mask per row), one draw per
following row; the forward of a run of k tokens costs about one decode step (fused kernels up
to 16 new tokens per row). `GenerationResult.forced_tokens` counts the run tokens taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from metagen.decoding.cost import Cost
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.rows import Completion, Row, StopRules, heal_request, request_chain, token_records
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams

__all__ = ["Completion", "GenerationResult", "StreamEvent", "generate", "generate_batch", "stream"]


@dataclass
class GenerationResult:
    """Completions for one prompt plus counts and timing (`cost` is set by a `Generator`).

    prompt_token_ids: None when unknown (a remote server given text or chat messages); with
        token healing, the prompt as fed (its healed tail removed).
    forced_tokens: tokens taken from jump-forward runs over all completions (each saved a
        forward of its row; see the module docstring).
    healed_text: the prompt text token healing removed and the output reproduced ("" when
        none); it is not part of the completions' text.
    """

    completions: list[Completion]
    prompt_token_ids: list[int]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    model_calls: int = 0
    cost: Cost | None = None
    forced_tokens: int = 0
    healed_text: str = ""

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
    jump_forward: bool = True,
) -> Iterator[StreamEvent]:
    """Decode `params.n` completions of `prompt` as one batch, yielding text as it is produced.

    The prompt is prefilled once and the cache forked into n rows. `generator` overrides
    `params.seed`; with neither, sampling draws from a fresh unseeded generator. Pass a
    `GenerationResult` as `result` to receive the completions when the stream ends.
    `processors`: extra logits processors run first (constraints), each given with its state
    after the prompt for one row; they are forked into the n rows, the given objects untouched.
    `jump_forward`: feed the runs of tokens a processor forces in one forward (module docstring);
    the output law is the same either way.
    `params.token_healing`: see `rows.heal_request` (the text returned excludes the healed part).
    """
    params = params or SamplingParams()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    prompt_ids, healed = heal_request(params, model, prompt, chat, prompt_ids)
    rules = StopRules.from_params(params, model, len(prompt_ids))
    if generator is None:
        generator = params.make_generator()  # seeded, or fresh OS entropy (torch's global RNG is left alone)
    n = params.n
    check_batch_fits(model, n, rules.max_new_tokens)  # before any per-row state is allocated
    chain = request_chain(params, model, prompt_ids, n, processors, healed=healed)
    rows = [Row(model.tokenizer, prompt_ids, rules, want_top=bool(params.logprobs), skip_text=healed)
            for _ in range(n)]
    result = result if result is not None else GenerationResult([], prompt_ids)
    result.prompt_token_ids, result.healed_text = prompt_ids, healed
    result.completions = [row.completion for row in rows]
    forcing = jump_forward and chain.judges_stop

    start = time.perf_counter()
    cache, out = model.prefill(prompt_ids, batch_size=n)
    result.prefill_seconds = time.perf_counter() - start
    result.model_calls += 1
    active = list(range(n))  # completion index of each cache row
    logits, runs = out.logits[:, None], [[] for _ in range(n)]  # (B, 1, V); no run fed yet
    decode_start = time.perf_counter()
    while True:
        steps = _Steps(chain, [rows[index] for index in active], active, params, generator)
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
        if len(keep) < len(active):
            cache.select(keep)
            chain.select(torch.tensor(keep, dtype=torch.long))
            active = [active[b] for b in keep]
        pending = [steps.pending[b] for b in keep]
        runs = ([_run(chain, b, rows[index]) for b, index in enumerate(active)] if forcing
                else [[] for _ in active])
        if any(runs):
            out = model.forward(cache, [[token] + run for token, run in zip(pending, runs)], logits="all")
            logits = out.logits  # (B, 1 + longest run, V)
        else:
            logits = model.forward(cache, torch.tensor(pending)[:, None]).logits[:, None]  # (B, 1, V)
        result.model_calls += 1
    result.decode_seconds = time.perf_counter() - decode_start


def _run(chain: SamplerChain, row: int, state: Row) -> list[int]:
    """The tokens the processors force after row `row`'s last token, cut to its budget."""
    room = state.rules.max_new_tokens - len(state.completion.token_ids)
    return chain.forced(row)[:room] if room > 0 else []


class _Steps:
    """One forward's worth of decoding for the batch: position j of `logits (B, T, V)` predicts the
    token after row b's pending token and `runs[b][:j]`; a row goes on to position j + 1 only
    while its drawn token equals its run's token (module docstring).

    After `take`: `pending[b]` is the drawn token row b feeds next (None: the row ended) and
    `followed[b]` how many tokens of its run it took."""

    def __init__(self, chain: SamplerChain, rows: list[Row], indices: list[int], params: SamplingParams,
                 generator: torch.Generator | None) -> None:
        self.chain, self.rows, self.indices = chain, rows, indices
        self.params, self.generator = params, generator
        self.pending: list[int | None] = [None] * len(rows)
        self.followed = [0] * len(rows)

    def take(self, logits: torch.Tensor, runs: list[list[int]]) -> Iterator[StreamEvent]:
        chain, params = self.chain, self.params
        batch = len(self.rows)
        going = list(range(batch))
        for j in range(logits.shape[1]):
            processed = chain.process(logits[:, j])  # (B, V); rows not going are processed but unused
            if len(going) == batch:
                position, index = logits[:, j], None
            else:
                index = torch.tensor(going, dtype=torch.long)
                position, processed = logits[index, j], processed[index]
            tokens = chain.choose(processed, self.generator)  # (G,)
            if index is None:
                chain.accept(tokens)
            else:
                chain.accept(torch.full((batch,), -1, dtype=torch.long).index_copy_(0, index, tokens))
            records = token_records(position, tokens, None if params.greedy else processed, params.logprobs or 0)
            still = []
            for g, (b, token) in enumerate(zip(going, tokens.tolist())):
                row = self.rows[b]
                text = row.push(token, records[g], chain.stop_verdict(b))
                finish = row.completion.finish_reason
                if text or finish:
                    yield StreamEvent(self.indices[b], text, token, finish)
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


def generate(
    model,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
    jump_forward: bool = True,
) -> GenerationResult:
    """Generate `params.n` completions of `prompt` (text, chat messages or token ids)."""
    result = GenerationResult([], [])
    for _ in stream(model, prompt, params, chat=chat, generator=generator, result=result, processors=processors,
                    jump_forward=jump_forward):
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
