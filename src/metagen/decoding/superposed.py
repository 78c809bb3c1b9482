"""Superposed decoding: k drafts from one forward per step (Shen et al. 2024, "Superposed
Decoding: Multiple Generations from a Single Autoregressive Inference Pass").

The k drafts share ONE cache row. Each step the model is fed, at the next position, the
superposition of the drafts' last tokens' input embeddings

    ẽ_t = Σ_i γ_i · E[x_t^i],      γ_i = exp(s_i) / Σ_j exp(s_j)

over the live drafts, s_i draft i's running score (below): the weights are the drafts'
probabilities under the decoder's own score, normalised over the live drafts and recomputed
every step, as the authors' released implementation does. Its one output distribution p_LM
(V,) serves every draft: the top-k tokens v_1 … v_k of p_LM extend each live draft, giving
(live drafts) × k candidates, each scored

    s(d·v) = s(d) + λ · log p_LM(v) + (1 − λ) · log p_ngram(v | d)

with p_ngram the n-gram model interpolated over orders 2 … N (`ngram_counts.NgramCounts`;
weights `order_weights`) on the prompt + draft tokens before v. This is the log-linear
(geometric) interpolation p_LM^λ · p_ngram^(1−λ) of the authors' code (their α = 1 − λ, 0.54
in their released settings); a candidate whose p_ngram is 0 — no order's context continues
with v in the counts — has no n-gram support and is filtered out. When fewer than k candidates
are supported, unsupported ones fill the remaining places, ranked after every supported one by
their LM term alone (s(d) + λ · log p_LM(v)): metagen's reading of the authors' large fixed
penalty on such drafts. The best k of the candidates and the drafts already finished (EOS, a
stop token or string) become the next drafts; the first step extends the prompt alone from the
prefill's distribution. λ = 1 ignores the n-grams: k = 1 is then greedy decoding.

The n-gram counts come from `corpus` (a text file, one document per line, or a list of texts,
tokenized with the model's tokenizer) and, unless `prompt_ngrams=False`, the prompt itself.
Defaults: λ = 0.46 and order weights (0.02, 0.08, 0.30, 0.36, 0.24) for n = 2 … 6, the
authors' released settings (their weights, which sum to 0.5, doubled: a common factor of
p_ngram shifts every supported candidate's score by the same amount, so the ranking is theirs).

Cost: the prefill, then one forward of one row (one position) per step for all k drafts
(`cost.forward_cost`), plus O(k² · orders) n-gram lookups and an O(V) top-k per step. A
completion's `logprobs` are log p_LM of its tokens under the superposed forward's shared
distribution (not the model's conditional given that draft alone); its `score` is s.
`Cost.target_steps` counts one per forward (one row), while `generated_tokens` counts the
returned drafts' tokens, so `block_efficiency` is about k.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

from metagen.decoding.batch import RowBatch
from metagen.decoding.cost import forward_cost
from metagen.decoding.ngram_counts import NgramCounts
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.records import TokenRecord
from metagen.decoding.result import GenerationResult
from metagen.decoding.rows import Row
from metagen.models.base import EmbeddingInput
from metagen.sampling import SamplingParams

ORDER_WEIGHTS = (0.02, 0.08, 0.30, 0.36, 0.24)  # n = 2 … 6
LM_WEIGHT = 0.46
Corpus = os.PathLike | Sequence[str] | None


@dataclass(frozen=True)
class SuperposedConfig:
    """lm_weight: λ in [0, 1], the LM's share of the log-linear interpolation (1: the LM alone,
    no n-grams); order_weights: w_n ≥ 0 of the n-gram orders n = 2, 3, …, 1 + len (some > 0);
    prompt_ngrams: count the prompt's n-grams too; max_tokens, stop, stop_token_ids,
    ignore_eos: what ends a draft, as in `SamplingParams`."""

    lm_weight: float = LM_WEIGHT
    order_weights: tuple[float, ...] = ORDER_WEIGHTS
    prompt_ngrams: bool = True
    max_tokens: int = 64
    stop: str | Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.lm_weight, bool) or not isinstance(self.lm_weight, (int, float)) \
                or not 0.0 <= self.lm_weight <= 1.0:
            raise ValueError(f"lm_weight={self.lm_weight!r} is out of range: must be a number in [0, 1]")
        weights = tuple(self.order_weights)
        if not weights or any(isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf
                              for w in weights) or not any(weights):
            raise ValueError(f"order_weights={self.order_weights!r} is out of range: must be finite numbers >= 0, "
                             "one per order n = 2, 3, ..., at least one > 0")
        object.__setattr__(self, "order_weights", tuple(float(w) for w in weights))
        checked = self.sampling_params()  # max_tokens, stop and stop_token_ids: SamplingParams' checks
        object.__setattr__(self, "stop", checked.stop)
        object.__setattr__(self, "stop_token_ids", checked.stop_token_ids)

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(range(2, 2 + len(self.order_weights)))

    def sampling_params(self) -> SamplingParams:
        """The fields shared with sampling, checked as `SamplingParams` checks them (ValueError
        names the field)."""
        return SamplingParams(max_tokens=self.max_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
                              ignore_eos=self.ignore_eos)


class Candidate(NamedTuple):
    """Live draft `parent` extended by `token`: its running score, whether the n-grams support
    the token, and log p_LM(token)."""

    parent: int
    token: int
    score: float
    supported: bool
    lm_logprob: float


def rank_candidates(scores: Sequence[float], contexts: Sequence[Sequence[int]], tokens: Sequence[int],
                    lm_logprobs: Sequence[float], counts: NgramCounts | None, order_weights: Sequence[float],
                    lm_weight: float) -> list[Candidate]:
    """Every extension of the D live drafts (running `scores` (D,), `contexts`: each one's
    prompt + tokens, or their tail of at least N − 1) by each of the k `tokens` (log p_LM
    `lm_logprobs` (k,)), best first: supported candidates by s + λ·log p_LM + (1 − λ)·log p_ngram,
    then unsupported ones by s + λ·log p_LM (module docstring). `counts` None (λ = 1): every
    candidate is supported, scored by the LM alone. Ties keep (draft, token rank) order. O(D·k·orders)."""
    candidates = []
    for parent, (score, context) in enumerate(zip(scores, contexts)):
        for token, lm in zip(tokens, lm_logprobs):
            ngram = 1.0 if counts is None else counts.probability(context, token, order_weights)
            if ngram > 0:
                step = lm if counts is None else lm_weight * lm + (1.0 - lm_weight) * math.log(ngram)
            else:
                step = lm_weight * lm
            candidates.append(Candidate(parent, token, score + step, ngram > 0, lm))
    return sorted(candidates, key=lambda c: (not c.supported, -c.score))


def superposition(model: EmbeddingInput, last_tokens: Sequence[int], scores: Sequence[float]) -> torch.Tensor:
    """ẽ = Σ_i γ_i · E[x_i] with γ = softmax(scores): (1, 1, H) float32, for `forward_embeddings`.
    One draft gives E[x] exactly (γ = 1)."""
    gamma = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0).float()  # (D,)
    rows = model.input_embeddings(torch.tensor(list(last_tokens))).float()  # (D, H)
    return (gamma[:, None] * rows).sum(dim=0)[None, None]


def corpus_counts(tokenizer, corpus: Corpus, prompt_ids: Sequence[int], config: SuperposedConfig
                  ) -> NgramCounts | None:
    """The n-gram counts of `corpus` (a path: a UTF-8 text file, one document per non-empty line;
    or a list of texts) and, with `config.prompt_ngrams`, the prompt; None when λ = 1. ValueError
    for a corpus that λ = 1 would ignore, for no source at all, and for a bare string."""
    if config.lm_weight == 1.0:
        if corpus is not None:
            raise ValueError("corpus is given but lm_weight=1: the n-gram model would have no weight")
        return None
    if corpus is None and not config.prompt_ngrams:
        raise ValueError(f"lm_weight={config.lm_weight} < 1 needs n-gram counts: give corpus (a file or a list of "
                         "texts) or prompt_ngrams=True")
    if isinstance(corpus, str):
        raise ValueError("corpus is a str: pass pathlib.Path(...) for a text file or [text] for a text")
    if isinstance(corpus, os.PathLike):
        path = Path(corpus)
        if not path.is_file():
            raise ValueError(f"corpus file {str(path)!r} does not exist or is not a file")
        corpus = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    counts = NgramCounts(config.orders)
    for index, text in enumerate(corpus or ()):
        if not isinstance(text, str):
            raise ValueError(f"corpus[{index}] is {type(text).__name__}: corpus must be a file path or a list of str")
        counts.add(tokenizer.encode(text, add_special_tokens=False))
    if config.prompt_ngrams:
        counts.add(prompt_ids)
    return counts


class _Draft(NamedTuple):
    row: Row
    score: float


def superposed_decode(model, prompt: Prompt, k: int = 3, *, corpus: Corpus = None,
                      config: SuperposedConfig | None = None, chat: bool | None = None) -> GenerationResult:
    """Generate `k` drafts of `prompt` with superposed decoding (module docstring): a
    `GenerationResult` of k completions, best score first (`Completion.score` = s), and its
    `Cost` (the prefill and one forward per step). `model` must take input vectors
    (`EmbeddingInput`: the native `DecoderModel`). ValueError for k outside [1, V] and for a
    corpus that cannot be read (`corpus_counts`)."""
    started = time.perf_counter()
    config = config or SuperposedConfig()
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.vocab_size:
        raise ValueError(f"k={k!r} is out of range: must be an int in [1, {model.vocab_size}] (the vocabulary)")
    if not isinstance(model, EmbeddingInput):
        raise ValueError(f"superposed decoding feeds a mixture of input embeddings: the model "
                         f"({type(model).__name__}) does not take them (EmbeddingInput: the native backend)")
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    # the prompt's one row, set up as every loop's: stop rules, memory check of one row, its `Row`
    batch = RowBatch.start(model, prompt_ids, config.sampling_params(), forward_rows=1)
    counts = corpus_counts(model.tokenizer, corpus, prompt_ids, config)
    tail = max(config.orders) - 1  # context tokens the longest order reads
    cache, out = batch.prefill()
    cost = batch.prefill_cost()
    prefill_seconds = time.perf_counter() - started
    drafts = [_Draft(batch.rows[0], 0.0)]
    logits, position, log_vocab = out.logits[0], len(prompt_ids), math.log(model.vocab_size)
    while True:
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (V,) shared by every draft
        top = torch.topk(logprobs, k)
        live = [d for d in drafts if not d.row.finished]
        contexts = [_tail(prompt_ids, d.row.completion.token_ids, tail) for d in live]
        ranked = rank_candidates([d.score for d in live], contexts, top.indices.tolist(), top.values.tolist(),
                                 counts, config.order_weights, config.lm_weight)
        # finished drafts keep competing with their final score, as supported candidates
        pool = sorted([(False, -d.score, i, d) for i, d in enumerate(drafts) if d.row.finished]
                      + [(not c.supported, -c.score, k + i, c) for i, c in enumerate(ranked)])[:k]
        certainty = -log_vocab - float(logprobs.mean())
        drafts = [entry if isinstance(entry, _Draft) else _extend(live[entry.parent], entry, certainty)
                  for *_, entry in pool]
        live = [d for d in drafts if not d.row.finished]
        if not live:
            break
        mixed = superposition(model, [d.row.completion.token_ids[-1] for d in live], [d.score for d in live])
        logits = model.forward_embeddings(cache, mixed).logits[0]
        cost += forward_cost(model, [position], 1)
        position += 1
    completions = [replace(d.row.completion, score=d.score) for d in drafts]
    cost.generated_tokens += sum(len(c.token_ids) for c in completions)
    cost.wall_seconds = time.perf_counter() - started
    return GenerationResult(completions, prompt_ids, cost, prefill_seconds=prefill_seconds,
                            decode_seconds=cost.wall_seconds - prefill_seconds)


def _tail(prompt_ids: Sequence[int], ids: Sequence[int], length: int) -> list[int]:
    """The last `length` tokens of prompt + ids, without copying the whole prompt."""
    if len(ids) >= length:
        return list(ids[len(ids) - length:])
    return list(prompt_ids[max(0, len(prompt_ids) - length + len(ids)):]) + list(ids)


def _extend(parent: _Draft, candidate: Candidate, certainty: float) -> _Draft:
    """`parent`'s row forked and pushed the candidate's token (chosen, not drawn: sampled log-prob 0)."""
    row = parent.row.fork()
    row.push(candidate.token, TokenRecord(candidate.lm_logprob, 0.0, certainty, None))
    return _Draft(row, candidate.score)
