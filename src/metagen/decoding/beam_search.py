"""Beam search with length normalization, and stochastic beam search (Gumbel-top-k).

Beam search keeps the `width` highest-scoring prefixes. Each step every live beam is extended
by every token, the 2·width best candidates by cumulative log-probability are scanned in order:
a candidate ending in EOS becomes a finished hypothesis scored
    score = logp / len^α      (length normalization, Wu et al. 2016 / seed 003)
and the others fill the next `width` beams. The search ends when `width` hypotheses are
finished and no live beam can still beat the worst of them (its best possible normalized score,
taken at the current length, is lower), or at `max_tokens`.
Cost per step: one batched forward of `width` rows plus O(width·V) for the top-k.

Stochastic beam search (Kool, van Hoof & Welling 2019) replaces the top-k by the Gumbel-top-k
of perturbed log-probabilities: children's Gumbels are conditioned so their max equals the
parent's perturbed score, which makes the `width` final beams a sample *without replacement*
from the model's sequence distribution (at `temperature`). A finished sequence keeps its slot
among the `width` best keys like a live beam (its key no longer changes); the search ends when
every slot is finished. Hypotheses come ordered by key: the first is distributed as one
ancestral sample, the second as a draw from the rest, and so on. Length normalization does not
apply (it would bias the sample).

Beams are forked with `cache.select(parents)`: children share their parent's cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from metagen.decoding.memory import check_batch_fits
from metagen.decoding.prompts import Prompt, encode_prompt


@dataclass(frozen=True)
class BeamSearchConfig:
    """width: beams kept per step; length_penalty: α in logp / len^α (0 = raw sum);
    max_tokens: new tokens at most; n_best: hypotheses returned (≤ width);
    stochastic: Gumbel-top-k instead of top-k (sampling without replacement);
    temperature: divides logits before the Gumbel perturbation (stochastic only)."""

    width: int = 4
    length_penalty: float = 1.0
    max_tokens: int = 64
    n_best: int = 1
    stochastic: bool = False
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width={self.width} is out of range: must be >= 1")
        if not 1 <= self.n_best <= self.width:
            raise ValueError(f"n_best={self.n_best} is out of range: must be in [1, width={self.width}]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} is out of range: must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} is out of range: must be > 0")


@dataclass
class Hypothesis:
    token_ids: list[int]
    logprob: float  # sum of token log-probabilities (the model's, untempered)
    score: float  # logprob / len^α; stochastic: the Gumbel-perturbed (tempered) log-probability
    text: str = ""
    finished: bool = True  # False when cut by max_tokens


@dataclass
class BeamSearchResult:
    hypotheses: list[Hypothesis]  # best first
    prompt_token_ids: list[int] = field(default_factory=list)
    model_calls: int = 0

    @property
    def text(self) -> str:
        return self.hypotheses[0].text


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
) -> BeamSearchResult:
    """Run (stochastic) beam search; returns `config.n_best` hypotheses, best first."""
    config = config or BeamSearchConfig()
    prompt_ids = encode_prompt(model.tokenizer, prompt, chat, vocab_size=model.vocab_size)
    if len(prompt_ids) >= model.max_context:
        raise ValueError(f"prompt has {len(prompt_ids)} tokens, the model's context is {model.max_context}")
    max_new = min(config.max_tokens, model.max_context - len(prompt_ids))
    check_batch_fits(model, 2 * config.width, max_new, what="width")  # 2·width candidates per step
    cache, out = model.prefill(prompt_ids)
    if config.stochastic:
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        ranked, calls = _stochastic_search(model, cache, out, config, max_new, generator)
    else:
        ranked, calls = _search(model, cache, out, config, max_new)
    for hypothesis in ranked:
        body = [t for t in hypothesis.token_ids if t not in model.eos_token_ids]
        hypothesis.text = model.tokenizer.decode(body, skip_special_tokens=True)
    return BeamSearchResult(ranked, prompt_ids, calls)


def _search(model, cache, out, config: BeamSearchConfig, max_new: int) -> tuple[list[Hypothesis], int]:
    """Deterministic beam search from the prefilled `cache` / `out`; (n_best hypotheses, calls)."""
    alpha, width = config.length_penalty, config.width
    calls = 1
    sums = torch.zeros(1)  # (B,) cumulative log-probs of live beams
    beams: list[list[int]] = [[]]
    finished: list[Hypothesis] = []
    for step in range(1, max_new + 1):
        logprobs = torch.log_softmax(out.logits, dim=-1)  # (B, V)
        candidates = sums[:, None] + logprobs  # (B, V)
        vocab = candidates.shape[1]
        top = torch.topk(candidates.reshape(-1), min(2 * width, candidates.numel()))
        parents = (top.indices // vocab).tolist()
        tokens = (top.indices % vocab).tolist()
        next_parents, next_tokens, next_sums = [], [], []
        for rank, (parent, token) in enumerate(zip(parents, tokens)):
            total = float(candidates[parent, token])
            if token in model.eos_token_ids:
                if rank < width:  # an EOS below the top `width` would not have been a beam
                    ids = beams[parent] + [token]
                    finished.append(Hypothesis(ids, total, _normalized(total, len(ids), alpha)))
                continue
            next_parents.append(parent)
            next_tokens.append(token)
            next_sums.append(total)
            if len(next_tokens) == width:
                break
        if not next_tokens:  # every candidate ended the sequence: no live beam is left
            beams = []
            break
        beams = [beams[p] + [t] for p, t in zip(next_parents, next_tokens)]
        sums = torch.tensor(next_sums)
        if len(finished) >= width:
            worst = sorted(h.score for h in finished)[-width]
            best_live = max(_normalized(s, step, alpha) for s in next_sums)
            if best_live < worst:
                break
        if step == max_new:
            break
        cache.select(next_parents)
        out = model.forward(cache, [[t] for t in next_tokens])
        calls += 1
    for ids, total in zip(beams, sums.tolist()):
        finished.append(Hypothesis(ids, total, _normalized(total, len(ids), alpha), finished=False))
    return sorted(finished, key=lambda h: h.score, reverse=True)[: config.n_best], calls


def _stochastic_search(
    model, cache, out, config: BeamSearchConfig, max_new: int, generator: torch.Generator
) -> tuple[list[Hypothesis], int]:
    """Stochastic beam search (Kool et al. 2019) from the prefilled cache; (n_best by key, calls).

    φ(y) = log q(y), q the model at `temperature`; a beam's key is its perturbed G_φ(y). Each step
    the `width` largest keys among the children of live beams and the finished sequences keep a
    slot. Cost per step: one forward of ≤ width rows plus O(width·V).
    """
    width = config.width
    calls = 1
    sums = torch.zeros(1)  # (B,) model log-probs of live beams
    phis = torch.zeros(1)  # (B,) tempered log-probs φ of live beams
    keys = torch.zeros(1)  # (B,) perturbed scores G_φ of live beams
    beams: list[list[int]] = [[]]
    finished: list[Hypothesis] = []  # score = key
    for step in range(1, max_new + 1):
        logprobs = torch.log_softmax(out.logits, dim=-1)  # (B, V)
        tempered = phis[:, None] + torch.log_softmax(out.logits / config.temperature, dim=-1)  # (B, V)
        child_keys = _gumbel_children(keys, tempered, generator)  # (B, V)
        vocab = child_keys.shape[1]
        top = torch.topk(child_keys.reshape(-1), min(width, child_keys.numel()))
        # The `width` best of finished sequences and children, by key.
        entries = [(h.score, h) for h in finished] + list(zip(top.values.tolist(), top.indices.tolist()))
        entries = sorted(entries, key=lambda entry: entry[0], reverse=True)[:width]
        finished, parents, tokens, next_keys = [], [], [], []
        for key, entry in entries:
            if isinstance(entry, Hypothesis):
                finished.append(entry)
                continue
            parent, token = divmod(entry, vocab)
            if token in model.eos_token_ids:
                total = float(sums[parent] + logprobs[parent, token])
                finished.append(Hypothesis(beams[parent] + [token], total, key))
            else:
                parents.append(parent)
                tokens.append(token)
                next_keys.append(key)
        if not tokens:
            break
        parent_index = torch.tensor(parents)
        token_index = torch.tensor(tokens)
        sums = sums[parent_index] + logprobs[parent_index, token_index]
        phis = tempered[parent_index, token_index]
        keys = torch.tensor(next_keys)
        beams = [beams[p] + [t] for p, t in zip(parents, tokens)]
        if step == max_new:
            finished += [Hypothesis(ids, total, key, finished=False)
                         for ids, total, key in zip(beams, sums.tolist(), next_keys)]
            break
        cache.select(parents)
        out = model.forward(cache, [[t] for t in tokens])
        calls += 1
    return sorted(finished, key=lambda h: h.score, reverse=True)[: config.n_best], calls
