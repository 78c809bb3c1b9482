"""Beam search with length normalization, and stochastic beam search (Gumbel-top-k).

Beam search keeps the `width` highest-scoring prefixes. Each step every live beam is extended
by every token, the 2·width best candidates by cumulative log-probability are scanned in order:
a candidate ending in EOS becomes a finished hypothesis scored
    score = logp / len^α      (length normalization, Wu et al. 2016)
and the others fill the next `width` beams. The search ends when `width` hypotheses are
finished and no live beam can still beat the worst of them, or at `max_tokens`. A live beam's
best possible normalized score is bounded over every length it can still reach
(`_best_reachable`): for α > 0 at `max_tokens` (logp / L^α grows with L for logp < 0), for α ≤ 0
at its current length.
Cost per step: one batched forward of `width` rows plus O(width·V) for the top-k. The result's
`Cost` counts the prefill (one model call, the prompt computed once, its FLOPs), one model call
and the FLOPs of each search step, and the tokens generated; it counts no target steps (a beam
step is not a draw of one row's next token, the quantity speculative decoding compares against).

Stochastic beam search (Kool, van Hoof & Welling 2019) replaces the top-k by the Gumbel-top-k
of perturbed log-probabilities: children's Gumbels are conditioned so their max equals the
parent's perturbed score, which makes the `width` final beams a sample *without replacement*
from the model's sequence distribution (at `temperature`). A finished sequence keeps its slot
among the `width` best keys like a live beam (its key no longer changes); the search ends when
every slot is finished. Hypotheses come ordered by key: the first is distributed as one
ancestral sample, the second as a draw from the rest, and so on. Length normalization does not
apply (it would bias the sample).

Beams are forked with `cache.select(parents)`: children share their parent's cached prefix.
What ends a beam is the shared per-row bookkeeping (`decoding.rows`): EOS (unless `ignore_eos`),
`stop_token_ids`, stop strings (the beam is finished, its text cut before the string), a
processor that ends the row, and `max_tokens` / the context (finished=False).

Processors (`processors=`, and the constraint of `config.structured_outputs`) act as masks: a
token a processor sets to -inf never extends a beam; EOS extends one only where the constraint
accepts. Deterministic search then ranks the allowed sequences by the model's own
log-probabilities (log p(y) over valid y, not renormalised per step); stochastic search samples
without replacement from the masked distribution renormalised per step (what the sampling loop
draws from, so its keys stay consistent). A processor that changes finite logits (bias,
penalties) would not be honoured by either and raises. Their state follows the beams: the
candidates fork the parents' rows and accept their token, the kept beams are selected from them.

Completeness: a hypothesis cut by `max_tokens` / the context (or left alive when the search
ended) where a processor does not accept it has `complete=False` (a JSON object not yet closed).
Hypotheses are ranked by (complete first, then score): an incomplete one never comes before a
complete one, whatever its score, and only complete hypotheses count towards the `width`
finished ones that end the deterministic search early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from metagen.decoding.cost import Cost, forward_flops
from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import TokenRecord
from metagen.decoding.request import request_chain
from metagen.decoding.result import Completion, GenerationResult
from metagen.decoding.rows import Row
from metagen.decoding.stop_rules import StopRules
from metagen.sampling import LogitsProcessor, SamplerChain, SamplingParams

if TYPE_CHECKING:
    from metagen.structured.spec import StructuredOutputs


@dataclass(frozen=True)
class BeamSearchConfig:
    """width: beams kept per step; length_penalty: α in logp / len^α (0 = raw sum);
    max_tokens: new tokens at most; n_best: hypotheses returned (≤ width);
    stochastic: Gumbel-top-k instead of top-k (sampling without replacement);
    temperature: divides logits before the Gumbel perturbation (stochastic only);
    stop, stop_token_ids, ignore_eos: what ends a beam besides EOS, as in `SamplingParams`;
    structured_outputs / response_format: a constraint every hypothesis must satisfy, as in
    `SamplingParams` (vLLM's and OpenAI's names; checked and compiled on construction)."""

    width: int = 4
    length_penalty: float = 1.0
    max_tokens: int = 64
    n_best: int = 1
    stochastic: bool = False
    temperature: float = 1.0
    stop: str | Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    structured_outputs: StructuredOutputs | Mapping[str, object] | None = None
    response_format: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width={self.width} is out of range: must be >= 1")
        if not 1 <= self.n_best <= self.width:
            raise ValueError(f"n_best={self.n_best} is out of range: must be in [1, width={self.width}]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} is out of range: must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} is out of range: must be > 0")
        # The same checks (and normal forms) as SamplingParams' fields of these names.
        checked = self.sampling_params()
        for name in ("stop", "stop_token_ids", "structured_outputs", "response_format"):
            object.__setattr__(self, name, getattr(checked, name))

    def sampling_params(self) -> SamplingParams:
        """The `SamplingParams` of the fields beam search shares with sampling (their checks, the
        constraint compiled once; ValueError names the field)."""
        return SamplingParams(stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                              structured_outputs=self.structured_outputs, response_format=self.response_format)


def _normalized(logprob: float, length: int, alpha: float) -> float:
    return logprob / (max(length, 1) ** alpha)


def _gumbel_children(parent_perturbed: torch.Tensor, logprobs: torch.Tensor, generator) -> torch.Tensor:
    """Perturbed scores of children conditioned on max = the parent's (Kool et al. 2019, eq. 23).

    parent_perturbed: (B,); logprobs: (B, V) cumulative log-probs of the children. Returns (B, V).
    """
    uniform = torch.rand(logprobs.shape, generator=generator).clamp_(1e-12, 1 - 1e-12)
    gumbel = logprobs - torch.log(-torch.log(uniform))  # G_φ ~ Gumbel(φ)
    top = gumbel.max(dim=-1, keepdim=True).values
    target = parent_perturbed[:, None]
    # shifted = −log(exp(−T) − exp(−Z) + exp(−G)), computed stably
    v = target - gumbel + torch.log1p(-torch.exp(gumbel - top))
    return target - torch.clamp(v, min=0) - torch.log1p(torch.exp(-v.abs()))


def beam_search(
    model,
    prompt: Prompt,
    config: BeamSearchConfig | None = None,
    *,
    chat: bool | None = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> GenerationResult:
    """Run (stochastic) beam search; returns `config.n_best` hypotheses as completions, best first
    (complete ones before incomplete ones), with the search's `Cost`. `processors`: masks (constraints) with their state after the prompt
    for one row; `config.structured_outputs` adds the constraint's processor before them."""
    started = time.perf_counter()
    config = config or BeamSearchConfig()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    rules = StopRules.create(model, len(prompt_ids), max_tokens=config.max_tokens, stop=config.stop,
                             stop_token_ids=config.stop_token_ids, ignore_eos=config.ignore_eos)
    check_batch_fits(model, 2 * config.width, rules.max_new_tokens, what="width")  # 2·width candidates per step
    params = config.sampling_params()
    beams = _Beams(model, config, Row(model.tokenizer, prompt_ids, rules),
                   request_chain(params, model, prompt_ids, 1, processors))
    cost = Cost(model_calls=1, prompt_tokens_computed=len(prompt_ids),  # the prefill
                flops=forward_flops(model, 0, len(prompt_ids)))
    cache, out = model.prefill(prompt_ids)
    prefill_seconds = time.perf_counter() - started
    if config.stochastic:
        if generator is None:  # fresh OS entropy, as every other loop without a seed
            generator = params.make_generator()
        ranked = _stochastic_search(model, cache, out, config, beams, generator, cost, len(prompt_ids))
    else:
        ranked = _search(model, cache, out, config, beams, cost, len(prompt_ids))
    cost.wall_seconds = time.perf_counter() - started
    return GenerationResult(ranked, prompt_ids, cost, prefill_seconds=prefill_seconds,
                            decode_seconds=cost.wall_seconds - prefill_seconds)


class _Beams:
    """The live beams' rows (text, stops) and processor state, and how candidates extend them."""

    def __init__(self, model, config: BeamSearchConfig, row: Row, chain: SamplerChain) -> None:
        self.model, self.config = model, config
        self.rows, self.chain = [row], chain
        self.log_vocab = math.log(model.vocab_size)

    def scores(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(model log-probs, masked log-probs) of the live beams' next tokens, both (B, V): the
        masked ones are -inf where a processor removed the token."""
        logprobs = torch.log_softmax(logits, dim=-1)
        if not self.chain.processors:
            return logprobs, logprobs
        processed = self.chain.process(logits)
        changed = torch.isfinite(processed) & (processed != logits)
        if bool(changed.any()):
            raise ValueError(f"beam search takes processors as masks (scores stay the model's log-probabilities): "
                             f"{', '.join(self.chain.names)} changed finite logits")
        return logprobs, logprobs.masked_fill(processed == float("-inf"), float("-inf"))

    def extend(self, logprobs: torch.Tensor, parents: list[int], tokens: list[int]) -> list[Row]:
        """The candidates' rows: each parent's row forked and pushed its token, with the verdict
        of the processors after it; the processors' state becomes the candidates' (`keep`)."""
        if self.chain.stateful:
            self.chain = self.chain.fork(torch.tensor(parents, dtype=torch.long))
            self.chain.accept(torch.tensor(tokens, dtype=torch.long))
        certainties = (-self.log_vocab - logprobs.mean(dim=-1)).tolist()
        chosen = logprobs[parents, tokens].tolist() if parents else []
        rows = []
        for i, (parent, token) in enumerate(zip(parents, tokens)):
            row = self.rows[parent].fork()
            row.push(token, TokenRecord(chosen[i], 0.0, certainties[parent], None), self.chain.stop_verdict(i))
            rows.append(row)
        return rows

    def verdict(self, beam: int) -> bool | None:
        """Whether the processors accept live beam `beam` as it stands (None: no opinion)."""
        return self.chain.stop_verdict(beam)[0]

    def keep(self, candidates: list[int], rows: list[Row]) -> None:
        """The next live beams are these candidates (indices into the last `extend`)."""
        self.rows = rows
        if self.chain.stateful:
            self.chain.select(torch.tensor(candidates, dtype=torch.long))


def _ended(row: Row) -> bool:
    """Ended for good (EOS, a stop token or string, a processor) rather than cut by length."""
    return row.completion.finish_reason == "stop"


def _hypothesis(row: Row, score: float, complete: bool | None = None) -> Completion:
    """The hypothesis of `row` with its `score`; `complete`: the processors' verdict for a row
    still alive (a row that ended carries its own). A copy: the row's lists are not shared."""
    completion = row.completion
    return replace(completion, text=completion.text if row.finished else row.full_text,
                   token_ids=list(completion.token_ids), logprobs=list(completion.logprobs),
                   sampling_logprobs=list(completion.sampling_logprobs), certainties=list(completion.certainties),
                   complete=completion.complete if row.finished else complete, score=score)


def _ranked(hypotheses: list[Completion], n_best: int) -> list[Completion]:
    """The n_best hypotheses, complete ones first, each group by score (best first)."""
    return sorted(hypotheses, key=lambda h: (h.complete is not False, h.score), reverse=True)[:n_best]


def _step_cost(cost: Cost, model, position: int, rows: int) -> None:
    """Count one search forward of `rows` beams, each feeding one token at `position`."""
    cost.model_calls += 1
    cost.flops += rows * forward_flops(model, position, 1)


def _best_reachable(logprob: float, length: int, longest: int, alpha: float) -> float:
    """An upper bound on logp(y′) / |y′|^α over every hypothesis y′ a live beam can still give:
    the beam (`length` tokens, cumulative `logprob` ≤ 0) itself or any extension of it up to
    `longest` tokens. Each token adds log p ≤ 0, so logp(y′) ≤ logprob and, with L = |y′| in
    [length, longest]:
        α > 0:  logp(y′) / L^α ≤ logprob / L^α ≤ logprob / longest^α   (grows with L when < 0)
        α = 0:  logp(y′) ≤ logprob
        α < 0:  logp(y′) · L^|α| ≤ logprob · L^|α| ≤ logprob · length^|α|   (shrinks with L)
    Taking it at the current length when α > 0 is no bound: the search stopped before a longer
    hypothesis that would have won."""
    return _normalized(logprob, longest if alpha > 0 else length, alpha)


def _search(model, cache, out, config: BeamSearchConfig, beams: _Beams, cost: Cost,
            position: int) -> list[Completion]:
    """Deterministic beam search from the prefilled `cache` / `out` (the prompt's `position`
    tokens); the n_best hypotheses, its forwards and tokens added to `cost`."""
    alpha, width = config.length_penalty, config.width
    longest = beams.rows[0].rules.max_new_tokens
    sums = torch.zeros(1)  # (B,) cumulative log-probs of live beams
    finished: list[Completion] = []
    step = 0
    while beams.rows:
        step += 1
        logprobs, allowed = beams.scores(out.logits)  # (B, V)
        candidates = sums[:, None] + allowed  # (B, V)
        vocab = candidates.shape[1]
        top = torch.topk(candidates.reshape(-1), min(2 * width, candidates.numel()))
        finite = [i for i, value in enumerate(top.values.tolist()) if value > float("-inf")]
        parents = [int(top.indices[i]) // vocab for i in finite]
        tokens = [int(top.indices[i]) % vocab for i in finite]
        totals = [float(top.values[i]) for i in finite]
        rows = beams.extend(logprobs, parents, tokens)
        kept, next_rows, next_sums = [], [], []
        for rank, (row, total) in enumerate(zip(rows, totals)):
            if _ended(row):
                if rank < width:  # an ending below the top `width` would not have been a beam
                    finished.append(_hypothesis(row, _normalized(total, len(row.completion.token_ids), alpha)))
                    cost.generated_tokens += 1
                continue
            kept.append(rank)
            next_rows.append(row)
            next_sums.append(total)
            if len(kept) == width:
                break
        cost.generated_tokens += len(kept)
        if not kept:  # every candidate ended the sequence: no live beam is left
            beams.rows = []
            break
        beams.keep(kept, next_rows)
        sums = torch.tensor(next_sums)
        complete = [h.score for h in finished if h.complete is not False]
        if len(complete) >= width:
            worst = sorted(complete)[-width]
            best_live = max(_best_reachable(s, step, longest, alpha) for s in next_sums)
            if best_live < worst:
                break
        if next_rows[0].finished:  # max_tokens / the context: every live beam has as many tokens
            break
        cache.select([parents[i] for i in kept])
        _step_cost(cost, model, position + step - 1, len(kept))
        out = model.forward(cache, [[tokens[i]] for i in kept])
    for b, (row, total) in enumerate(zip(beams.rows, sums.tolist())):
        finished.append(_hypothesis(row, _normalized(total, len(row.completion.token_ids), alpha),
                                    complete=beams.verdict(b)))
    return _ranked(finished, config.n_best)


def _stochastic_search(
    model, cache, out, config: BeamSearchConfig, beams: _Beams, generator: torch.Generator, cost: Cost,
    position: int
) -> list[Completion]:
    """Stochastic beam search (Kool et al. 2019) from the prefilled cache (the prompt's `position`
    tokens); the n_best hypotheses by key, its forwards and tokens added to `cost`.

    φ(y) = log q(y), q the model at `temperature` (masked and renormalised per step when
    processors remove tokens); a beam's key is its perturbed G_φ(y). Each step the `width`
    largest keys among the children of live beams and the finished sequences keep a slot. Cost
    per step: one forward of ≤ width rows plus O(width·V).
    """
    width = config.width
    phis = torch.zeros(1)  # (B,) tempered log-probs φ of live beams
    keys = torch.zeros(1)  # (B,) perturbed scores G_φ of live beams
    finished: list[Completion] = []  # score = key
    while beams.rows:
        logprobs, allowed = beams.scores(out.logits)  # (B, V)
        step = torch.log_softmax(out.logits / config.temperature, dim=-1)
        if allowed is not logprobs:  # renormalise over the allowed tokens
            step = torch.log_softmax(step.masked_fill(allowed == float("-inf"), float("-inf")), dim=-1)
        tempered = phis[:, None] + step  # (B, V)
        child_keys = _gumbel_children(keys, tempered, generator)  # (B, V)
        vocab = child_keys.shape[1]
        top = torch.topk(child_keys.reshape(-1), min(width, child_keys.numel()))
        # The `width` best of finished sequences and children, by key.
        children = [(key, index) for key, index in zip(top.values.tolist(), top.indices.tolist())
                    if key > float("-inf")]
        entries = sorted([(h.score, h) for h in finished] + children, key=lambda entry: entry[0], reverse=True)[:width]
        chosen = [(key, divmod(entry, vocab)) for key, entry in entries if not isinstance(entry, Completion)]
        finished = [entry for _, entry in entries if isinstance(entry, Completion)]
        parents = [parent for _, (parent, _) in chosen]
        tokens = [token for _, (_, token) in chosen]
        rows = beams.extend(logprobs, parents, tokens)
        kept, next_rows, next_keys = [], [], []
        for i, (row, (key, _)) in enumerate(zip(rows, chosen)):
            if _ended(row):
                finished.append(_hypothesis(row, key))
            else:
                kept.append(i)
                next_rows.append(row)
                next_keys.append(key)
        cost.generated_tokens += len(rows)
        if not kept:
            break
        if next_rows[0].finished:  # max_tokens / the context
            finished += [_hypothesis(row, key) for row, key in zip(next_rows, next_keys)]
            break
        beams.keep(kept, next_rows)
        parent_index = torch.tensor([parents[i] for i in kept])
        token_index = torch.tensor([tokens[i] for i in kept])
        phis = tempered[parent_index, token_index]
        keys = torch.tensor(next_keys)
        cache.select(parent_index.tolist())
        _step_cost(cost, model, position, len(kept))
        position += 1
        out = model.forward(cache, [[t] for t in token_index.tolist()])
    return _ranked(finished, config.n_best)
