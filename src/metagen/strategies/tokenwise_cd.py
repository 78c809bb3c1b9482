"""Tokenwise controlled decoding (Mudgal et al. 2024, seed 002; FUDGE, Yang & Klein 2021).

Each token is drawn from the value-tilted distribution over the top-k candidates of p:

    π(z | x, y) = p(z | x, y) · exp(λ · V([x, y, z])) / Z        z ∈ top-k of p(· | x, y)

p is the model's distribution after the sampling adapters (temperature, top-p, ...). One step
for B rows: fork every row into its k candidates (page-table copies), run the B·k candidates
through the model in one forward with hidden states, value them in one batched call, draw one
per row, and keep that candidate's row — its forward already gave the next distribution, so the
chosen token is never run twice. Cost per token: k forwarded rows instead of 1, plus k values;
Cost.generated_tokens counts all k candidates (what was computed), not only the kept token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.decoding.prompts import Prompt, encode_prompt, stop_token_set
from metagen.sampling import SamplerChain, SamplingParams
from metagen.scoring.answers import extract_answer
from metagen.strategies.result import Candidate, StrategyResult


@dataclass(frozen=True)
class TokenwiseCDConfig:
    """n: samples drawn (rows decoded together); top_k: candidates valued per token; strength:
    λ; params: stateless sampling adapters forming p, max_tokens, stop strings and tokens."""

    n: int = 1
    top_k: int = 8
    strength: float = 1.0
    params: SamplingParams = SamplingParams(temperature=1.0, max_tokens=256)
    pattern: str | None = None

    def __post_init__(self) -> None:
        for name in ("n", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is out of range: must be >= 1")


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    value: float | None = None
    finish_reason: str | None = None


def tilted_choice(logprobs: torch.Tensor, values: torch.Tensor, strength: float,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Draw one of k candidates per row from softmax(log p + λ·V): logprobs, values (B, k) → (B,)."""
    weights = torch.softmax(logprobs.double() + strength * values.double(), dim=-1)
    return torch.multinomial(weights, 1, generator=generator).squeeze(1)


def tokenwise_cd(model, prompt: Prompt, value, config: TokenwiseCDConfig | None = None, *,
                 chat: bool | None = None, rng: torch.Generator | None = None) -> StrategyResult:
    config = config or TokenwiseCDConfig()
    params = config.params
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    chain = SamplerChain.from_params(params, 1, model.vocab_size, prompt_ids)
    if chain.stateful:
        raise ValueError("tokenwise CD needs stateless sampling adapters (no penalties, n-gram blocking, mirostat)")
    generator = rng if rng is not None else params.make_generator()
    stop_ids = stop_token_set(params, model)
    max_new = min(params.max_tokens, model.max_context - len(prompt_ids))
    start = time.perf_counter()
    cache, out = model.prefill(prompt_ids, batch_size=config.n)
    cost = Cost(model_calls=1, prompt_tokens_computed=len(prompt_ids),
                prompt_tokens_reused=len(prompt_ids) * (config.n - 1), flops=forward_flops(model, 0, len(prompt_ids)))
    rows = [_Row() for _ in range(config.n)]
    active, logits = list(range(config.n)), out.logits  # (B, V)
    k = min(config.top_k, model.vocab_size)
    while active:
        processed = torch.log_softmax(chain.process(logits), dim=-1)  # log p after the adapters
        top = torch.topk(processed, k, dim=-1)  # (B, k); -inf entries carry weight 0
        raw = torch.log_softmax(logits, dim=-1).gather(1, top.indices)  # unmodified log p, (B, k)
        b_count = len(active)
        cache.select([b for b in range(b_count) for _ in range(k)])
        with torch.no_grad():
            out = model.forward(cache, top.indices.reshape(-1, 1), hidden=value.needs_hidden)
        continuations = [rows[i].tokens + [z] for i, zs in zip(active, top.indices.tolist()) for z in zs]
        scored = value.values(prompt_ids, continuations, out.hidden)
        scored.cost.scorer_flops = scored.cost.flops
        cost += scored.cost
        cost.model_calls += 1
        cost.generated_tokens += b_count * k  # every candidate is run and valued, not only the kept one
        cost.target_steps += b_count * k
        cost.flops += sum(forward_flops(model, len(prompt_ids) + len(rows[i].tokens), 1) for i in active) * k
        # each candidate extends its row's cached prefix, which valuing [x, y, z] from scratch would recompute
        cost.prompt_tokens_reused += k * sum(len(prompt_ids) + len(rows[i].tokens) for i in active)
        values = torch.tensor(scored.values).view(b_count, k)
        choice = tilted_choice(top.values, values, config.strength, generator)  # (B,)
        keep, chosen_rows = [], []
        for b, index in enumerate(active):
            c = int(choice[b])
            token, row = int(top.indices[b, c]), rows[index]
            row.tokens.append(token)
            row.logprobs.append(float(raw[b, c]))
            row.value = float(values[b, c])
            if token in stop_ids:
                row.finish_reason = "stop"
            elif len(row.tokens) >= max_new:
                row.finish_reason = "length"
            elif params.stop and any(s in model.tokenizer.decode(row.tokens, skip_special_tokens=True)
                                     for s in params.stop):
                row.finish_reason = "stop"
            else:
                keep.append(index)
                chosen_rows.append(b * k + c)
        cache.select(chosen_rows)
        logits = out.logits[chosen_rows]
        active = keep
    cost.wall_seconds = time.perf_counter() - start
    candidates = [_candidate(model, row, config, params) for row in rows]
    best = max(range(len(candidates)), key=lambda i: candidates[i].score)
    return StrategyResult(candidates[best], candidates, cost)


def _candidate(model, row: _Row, config: TokenwiseCDConfig, params: SamplingParams) -> Candidate:
    text = model.tokenizer.decode(row.tokens, skip_special_tokens=True)
    for stop in params.stop:
        at = text.find(stop)
        if at >= 0:
            text = text[:at]
    return Candidate(text, row.tokens, row.logprobs, row.finish_reason, score=row.value,
                     answer=extract_answer(text, config.pattern))
