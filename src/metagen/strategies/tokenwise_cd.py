"""Tokenwise controlled decoding (Mudgal et al. 2024; FUDGE, Yang & Klein 2021).

Each token is drawn from the value-tilted distribution over the top-k candidates of p:

    π(z | x, y) = p(z | x, y) · exp(λ · V([x, y, z])) / Z        z ∈ top-k of p(· | x, y)

(or, with token_choice="argmax", its mode: argmax_z log p + λ·V). Transfer Q* (`transfer_q.py`) is
this loop with V the rollout estimate Q̂ of an aligned baseline model and λ = 1/β.

p is the model's distribution after the logits processors (penalties, temperature, top-p, a
constraint, ...). One step for B rows: fork every row into its k candidates (page-table copies),
run the B·k candidates through the model in one forward with hidden states, value them in one
batched call, draw one per row, and keep that candidate's row — its forward already gave the
next distribution, so the chosen token is never run twice. The rows are a `decoding.batch.RowBatch`
of n rows: set up by `RowBatch.start` (stop rules, sampler chain, rows, and the memory check of
the n·top_k rows each forward runs, naming them), prefilled by `RowBatch.prefill`, and shrunk by
`RowBatch.keep(live rows, cache_rows=the chosen candidates' rows)`, the one "drop finished rows"
(the cache keeps each live row's chosen candidate, the chain and `active` follow). The
processors' state needs no k-fold fork: each row accepts its chosen token, which is the state of
the kept candidate's row. Stops, records and text are the shared per-row bookkeeping
(`decoding.rows`). Cost per token: k forwarded rows instead of 1, plus k values; each forward is
`cost.forward_cost` of the B·k candidate rows (a target step each: every drawn token is fed, and
the prefill counts none), and Cost.generated_tokens counts all k candidates (what was computed),
not only the kept token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult, prefer_complete
from metagen.sampling import SamplingParams
from metagen.scoring.answers import check_answer_field, extract_answer
from metagen.strategies import runners
from metagen.strategies.options import check_options, configure, option
from metagen.strategies.spec import StrategySpec, register, shared

if TYPE_CHECKING:
    import torch

    from metagen.decoding.prompts import Prompt
    from metagen.decoding.rows import Row
    from metagen.sampling import LogitsProcessor


@dataclass(frozen=True)
class TokenwiseCDConfig:
    """n: samples drawn (rows decoded together); top_k: candidates valued per token; strength:
    λ; params: the sampling adapters forming p, max_tokens, stop strings and tokens."""

    n: int = option(1, int, "samples drawn (rows decoded together)", low=1, sizes_work=True)
    top_k: int = option(8, int, "candidate tokens valued per token", low=1, sizes_work=True)
    strength: float = option(1.0, float, "λ, the weight of the value in p · exp(λ · V)")
    token_choice: str = option("sample", str, "draw each token from p · exp(λ · V) (sample) or take its mode "
                               "(argmax)", choices=("sample", "argmax"))
    params: SamplingParams = SamplingParams(temperature=1.0, max_tokens=256)
    pattern: str | None = shared("pattern")
    answer_field: str | None = shared("answer_field")  # the answer is this field of a JSON output (not pattern)

    def __post_init__(self) -> None:
        check_options(self)
        check_answer_field(self.pattern, self.answer_field)


def tilted_choice(logprobs: torch.Tensor, values: torch.Tensor, strength: float,
                  generator: torch.Generator | None, *, argmax: bool = False) -> torch.Tensor:
    """Draw one of k candidates per row from softmax(log p + λ·V), or with `argmax` take its mode
    (the first among ties): logprobs, values (B, k) → (B,). O(B·k)."""
    import torch  # here (a dict lookup per token): importing the config imports no torch

    scores = logprobs.double() + strength * values.double()  # (B, k)
    if argmax:
        return torch.argmax(scores, dim=-1)
    return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)


def tokenwise_cd(model, prompt: Prompt, value, config: TokenwiseCDConfig | None = None, *,
                 chat: bool | None = None, rng: torch.Generator | None = None,
                 processors: Sequence[LogitsProcessor] = ()) -> GenerationResult:
    """Draw `config.n` sequences token by token from π (module docstring); the candidate of best
    value is chosen. `processors`: extra logits processors forming p (constraints), as in `stream`."""
    import torch  # here: importing the config imports no torch

    from metagen.decoding.batch import RowBatch
    from metagen.decoding.cost import forward_cost, prefill_cost
    from metagen.decoding.prompts import encode_prompt
    from metagen.decoding.records import token_records
    from metagen.decoding.request import refuse_token_healing

    config = config or TokenwiseCDConfig()
    refuse_token_healing(config.params, "tokenwise controlled decoding")
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    k = min(config.top_k, model.vocab_size)
    argmax = config.token_choice == "argmax"
    batch = RowBatch.start(model, prompt_ids, replace(config.params, n=config.n), processors, generator=rng,
                           forward_rows=config.n * k, what="n·top_k")  # each forward runs n·k candidate rows
    chain, generator, rows = batch.chain, batch.generator, batch.rows
    start = time.perf_counter()
    cache, out = batch.prefill()
    cost = prefill_cost(model, len(prompt_ids), config.n, produced=False)  # target steps: the fed candidates
    row_values: list[float | None] = [None] * config.n
    logits = out.logits  # (B, V)
    while True:
        active = batch.active
        processed = torch.log_softmax(chain.process(logits), dim=-1)  # log p after the processors
        top = torch.topk(processed, k, dim=-1)  # (B, k); -inf entries carry weight 0
        b_count = len(active)
        cache.select([b for b in range(b_count) for _ in range(k)])
        with torch.no_grad():
            out = model.forward(cache, top.indices.reshape(-1, 1), hidden=value.needs_hidden)
        continuations = [rows[i].completion.token_ids + [z] for i, zs in zip(active, top.indices.tolist()) for z in zs]
        scored = value.values(prompt_ids, continuations, out.hidden)
        scored.cost.scorer_flops = scored.cost.flops
        cost += scored.cost
        lengths = [len(prompt_ids) + len(rows[i].completion.token_ids) for i in active]
        cost += forward_cost(model, [length for length in lengths for _ in range(k)])  # the B·k candidate rows
        cost.generated_tokens += b_count * k  # every candidate is run and valued, not only the kept one
        # each candidate extends its row's cached prefix, which valuing [x, y, z] from scratch would recompute
        cost.prompt_tokens_reused += k * sum(lengths)
        values = torch.tensor(scored.values).view(b_count, k)
        choice = tilted_choice(top.values, values, config.strength, generator, argmax=argmax)  # (B,)
        tokens = top.indices.gather(1, choice[:, None]).squeeze(1)  # (B,)
        chain.accept(tokens)
        # π as logits over the vocabulary: log p + λV on the top-k, -inf elsewhere
        tilted = torch.full_like(processed, float("-inf")).scatter_(
            1, top.indices, top.values + config.strength * values.to(processed.dtype))
        records = token_records(logits, tokens, tilted)
        for b, (index, token) in enumerate(zip(active, tokens.tolist())):
            batch.push(b, token, records[b])
            row_values[index] = float(values[b, int(choice[b])])
        keep = batch.live()
        if not keep:  # every row ended (a processor's state has no empty batch)
            break
        chosen_rows = [b * k + int(choice[b]) for b in keep]  # the kept rows' chosen candidates
        batch.keep(keep, cache_rows=chosen_rows)
        logits = out.logits[chosen_rows]
    cost.wall_seconds = time.perf_counter() - start
    candidates = [_candidate(row, score, config) for row, score in zip(rows, row_values)]
    best = max(prefer_complete(candidates), key=lambda c: c.score)  # never a cut output over a complete one
    return GenerationResult(candidates, cost=cost, chosen=best)


def _candidate(row: Row, score: float | None, config: TokenwiseCDConfig) -> Completion:
    completion = row.completion
    return Completion(completion.text, completion.token_ids, completion.logprobs,
                      finish_reason=completion.finish_reason, certainties=completion.certainties, score=score,
                      answer=extract_answer(completion.text, config.pattern, config.answer_field),
                      complete=completion.complete)


def _runner(generator, prompt, n, params, options, rng, overrides):
    from metagen.strategies.tree.runner import run_search

    params = replace(params, n=1)
    config = TokenwiseCDConfig(n=1, top_k=n, params=params, pattern=options.pattern, answer_field=options.answer_field)
    return run_search(tokenwise_cd, configure(config, overrides), generator, prompt, options, rng, local_only=True)

register(StrategySpec("tokenwise_cd", "tokenwise controlled decoding over the top n tokens, strength 4 (--value)",
                      _runner, pooled=False, uses_value=True, needs=frozenset({caps.LOCAL_CACHE}),
                      why="it values the top-k next tokens at every position, which needs a local model",
                      config=TokenwiseCDConfig, set_by_run=frozenset({"n", "top_k", "params"}),
                      defaults=(("strength", runners.LAMBDA),)), __name__)
