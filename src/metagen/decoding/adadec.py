"""AdaDec: entropy-triggered lookahead reranking (He, Liu, Wang, Li, Wang, Peng & Zheng 2025,
"Towards Better Code Generation: Adaptive Decoding with Uncertainty Guidance", arXiv:2506.08980).

Decoding goes on as usual (greedy, or a draw) while the model is sure of its next token. At
step t a row's next-token entropy in bits, of the model's own distribution (before any
processor),

    H_t = −Σ_v p_t(v) · log2 p_t(v),

decides whether it pauses: when H_t > τ the row ranks the B candidates c of highest processed
score (the chain's output: a constraint's or n-gram blocking's bans are never candidates) by a
greedy lookahead. Each candidate's prefix x_<t, c is continued greedily (the argmax of the
chain's processed scores) for up to L tokens x_1 … x_ℓ, and scored by the mean model
log-probability of the candidate and its lookahead,

    S(c) = ( log p(c | x_<t) + Σ_{i=1..ℓ} log p(x_i | x_<t, c, x_<i) ) / (ℓ + 1),

ℓ = L unless the row would end first (a stop token, a stop string, max_tokens or the context,
a constraint ending it: the ending token is the last one scored; ℓ = 0 when c itself ends the
row). The row takes argmax_c S(c), ties going to the higher-ranked candidate; then decoding goes
on from prefix + that token. τ = inf never pauses: the output is plain decoding's, token for token.

Where the published material had to be read (the scoring follows the authors' released code,
SYSUSELab/AdaDec, `lookahead_scoring_function` of its AdaFixL mode):
  * the score is the *mean* over c and its ℓ lookahead tokens, not the sum (their
    (current + lookahead) / (actual_length + 1)); a sum would favour candidates whose lookahead
    ends early (an EOS after one token) for having fewer negative terms. Their running
    sequence score and weight λ > 0 add the same amount to every candidate of one greedy row,
    so they are left out;
  * their lookahead defaults are B = 3 candidates and L = 5 tokens, used here;
  * their trigger is H ≥ τ in nats (`learned_thresholds.json`); here H > τ in bits, so a
    threshold learned in nats is τ / ln 2 here (`fit_entropy_threshold` is unit-agnostic);
  * the threshold is learned per model by logistic regression of "greedy diverged from the
    reference" on the entropy of teacher-forced steps (`fit_entropy_threshold`).

Under sampling the steps that do not pause draw as usual, and a paused step takes the best
candidate (the rerank is deterministic, as the paper's greedy decoder is). The records keep the
model's own log-probabilities; a reranked token's `sampling_logprobs` is its log-probability in
the distribution the step would have drawn from.

Mechanism (no loop of its own: one call inside the sampling loop's step, `adadec_step`): every
live cache row is kept aside as a snapshot (`cache.snapshot`, PG-TD's way of holding a prefix:
page-table references, no K/V copy); the cache becomes the T·B lookahead rows (`cache.select`
of the paused rows, each B times, as beam search and tokenwise CD fork rows); the lookahead
runs at most L forwards over them, rows whose lookahead ended leaving (`select`); then
`cache.restore(snapshots)` gives the live rows back unchanged. Each lookahead row has its own
`Row.fork` (text, stop strings, max tokens) and the chain's processor state (`chain.fork`), so
it ends exactly where the real row would.

Cost: every lookahead forward is `cost.forward_cost` of its rows (one model call, the FLOPs of
each row's token at its position; no target step, since the row's token is drawn from the main
forward's logits), added to the step's `Cost`; `GenerationResult.lookahead_steps` counts the
row-steps that paused. A paused row costs at most B·L token-forwards more, in at most L calls;
the chosen candidate is fed again by the main step (its lookahead cache row is dropped).
Memory: the check of `RowBatch.start` counts n·(B + 1) rows (the n rows held aside and their
n·B lookahead rows). Time per step: O(rows·V) for the entropies; a step where T rows pause adds
O(T·B·V) per lookahead forward (log-softmax and argmax) and O(tokens so far) per lookahead row
(`Row.fork`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from metagen.decoding.cost import Cost, forward_cost
from metagen.decoding.entropy_adaptive import entropy_bits
from metagen.decoding.records import TokenRecord
from metagen.sampling.sample import argmax

_UNRECORDED = TokenRecord(0.0, 0.0, 0.0, None)  # what a lookahead row records (it is dropped)


@dataclass(frozen=True)
class AdaDecConfig:
    """AdaDec's settings (module docstring), given to `generate` / `stream` as `rerank=`.

    threshold: τ ≥ 0 in bits: a row pauses and reranks when its next-token entropy is above it
        (inf: never; `fit_entropy_threshold` learns it for a model).
    candidates: B ≥ 2, the tokens of highest processed score that are reranked (the paper's 3).
    lookahead: L ≥ 1, the greedy tokens scored after each candidate (the paper's 5).
    """

    threshold: float
    candidates: int = 3
    lookahead: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or not self.threshold >= 0:
            raise ValueError(f"threshold={self.threshold!r} is out of range: must be a number of bits >= 0 "
                             "(inf: never pause)")
        for name, low in (("candidates", 2), ("lookahead", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is out of range: must be an int >= {low}")


def fit_entropy_threshold(entropies: Sequence[float], diverged: Sequence[bool], *, ridge: float = 1.0) -> float:
    """τ learned from labelled steps, as the paper learns it per model: `entropies[i]` is the
    entropy at a teacher-forced step of reference solutions, `diverged[i]` whether greedy's token
    there differs from the reference's. Fits P(diverged | H) = σ(w·H + b) by class-balanced,
    ridge-penalised logistic regression,

        minimise  Σ_i s_i · [−y_i log σ(w H_i + b) − (1 − y_i) log(1 − σ(w H_i + b))] + ridge · w² / 2,

    s_i = N / (2 · size of i's class) (each class weighs N / 2: the authors balance the classes by
    subsampling the larger one; weights do it without discarding steps), ridge on w only
    (scikit-learn's `LogisticRegression(class_weight="balanced")` with C = 1 / ridge, the
    authors' default C = 1). Returns τ = −b / w, the entropy where the balanced odds of diverging
    are even; it is in the unit of `entropies` (give bits for `AdaDecConfig`).

    Newton's method on the 2-parameter convex objective (at most 100 steps, to a 1e-12
    gradient). ValueError for inputs of different lengths, fewer than two steps, a class with no
    step, a non-finite entropy, ridge < 0, or a fit where entropy does not raise the odds (w ≤ 0:
    no threshold exists). O(N) per step.
    """
    x = torch.as_tensor(list(entropies), dtype=torch.float64)
    y = torch.as_tensor([bool(d) for d in diverged], dtype=torch.float64)
    if x.numel() != y.numel():
        raise ValueError(f"entropies has {x.numel()} steps and diverged {y.numel()}: one label per step")
    positives = int(y.sum())
    if x.numel() < 2 or positives in (0, x.numel()):
        raise ValueError(f"diverged has {positives} diverged steps of {x.numel()}: both classes are needed")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("entropies must be finite numbers")
    if not ridge >= 0:
        raise ValueError(f"ridge={ridge!r} is out of range: must be >= 0")
    count = x.numel()
    weights = torch.where(y > 0, count / (2.0 * positives), count / (2.0 * (count - positives)))  # (N,)
    features = torch.stack([x, torch.ones_like(x)], dim=1)  # (N, 2): w, b
    theta = torch.zeros(2, dtype=torch.float64)
    penalty = torch.diag(torch.tensor([ridge, 0.0], dtype=torch.float64))
    for _ in range(100):
        p = torch.sigmoid(features @ theta)  # (N,)
        gradient = features.T @ (weights * (p - y)) + penalty @ theta  # (2,)
        if float(gradient.abs().max()) < 1e-12:
            break
        hessian = features.T @ (features * (weights * p * (1 - p))[:, None]) + penalty  # (2, 2)
        theta = theta - torch.linalg.solve(hessian, gradient)
    slope, intercept = float(theta[0]), float(theta[1])
    if not slope > 0 or not math.isfinite(intercept):
        raise ValueError(f"the fit gives P(diverged) a slope of {slope:.4g} in the entropy: a higher entropy does "
                         "not make divergence likelier in these steps, so no threshold separates them")
    return -intercept / slope


def adadec_step(batch, logits: Tensor, processed: Tensor, tokens: Tensor, position: int,
                config: AdaDecConfig) -> tuple[Tensor, Cost, int]:
    """One sampling-loop step's rerank: `logits (B, V)` the model's raw logits of the live rows,
    `processed (B, V)` the chain's output, `tokens (B,)` the chain's choice; every live cache row
    of `batch` (a `RowBatch`) holds `position` tokens. Returns the tokens with the paused rows'
    replaced by their best candidate (a new tensor; the inputs are untouched), the lookahead's
    `Cost` and how many rows paused."""
    paused = torch.nonzero(entropy_bits(logits) > config.threshold).flatten()  # (T,)
    if paused.numel() == 0:
        return tokens, Cost(), 0
    k = min(config.candidates, processed.shape[-1])
    top = torch.topk(processed[paused], k, dim=-1)  # (T, k), best first
    allowed = top.values > float("-inf")  # (T, k): candidates the processors did not rule out
    logprobs = torch.log_softmax(logits[paused].float(), dim=-1).gather(1, top.indices).double()  # (T, k)
    flat = torch.nonzero(allowed.flatten()).flatten()  # the lookahead rows, (N,)
    parents = paused.repeat_interleave(k)[flat]  # (N,) the live row each continues
    sums, counts, cost = greedy_lookahead(batch, parents.tolist(), top.indices.flatten()[flat], position,
                                          config.lookahead)
    totals = torch.zeros(allowed.numel(), dtype=torch.float64).index_copy(0, flat, sums).view_as(logprobs)
    lengths = torch.zeros(allowed.numel(), dtype=torch.float64).index_copy(0, flat, counts).view_as(logprobs)
    scores = ((logprobs + totals) / (1 + lengths)).masked_fill(~allowed, float("-inf"))  # S(c), (T, k)
    chosen = tokens.clone()
    chosen[paused] = top.indices.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)  # first max: best rank
    return chosen, cost, int(paused.numel())


def greedy_lookahead(batch, parents: list[int], first: Tensor, position: int,
                     length: int) -> tuple[Tensor, Tensor, Cost]:
    """Continue live row `parents[i]` of `batch` with `first[i]` and then greedily (the argmax of
    the chain's processed scores) for up to `length` tokens, on forks of the rows (module
    docstring); the batch's cache, chain and rows are as before when it returns. Returns, per
    lookahead row `(N,)` float64, the sum of the model's log-probabilities of the tokens after
    `first[i]` and their number ℓ, and the forwards' `Cost`."""
    model, cache = batch.model, batch.cache
    sums = torch.zeros(len(parents), dtype=torch.float64)  # (N,)
    counts = torch.zeros(len(parents), dtype=torch.float64)  # (N,)
    cost = Cost()
    chain = batch.chain.fork(torch.tensor(parents, dtype=torch.long))
    chain.accept(first)
    rows = [batch.row(b).fork() for b in parents]
    for i, (row, token) in enumerate(zip(rows, first.tolist())):
        row.push(token, _UNRECORDED, chain.stop_verdict(i))
    going = [i for i, row in enumerate(rows) if not row.finished]  # a candidate may end its row at once
    if not going:
        return sums, counts, cost
    held = [cache.snapshot(b) for b in range(cache.batch_size)]  # the live rows, kept aside
    try:
        cache.select([parents[i] for i in going])
        chain.select(torch.tensor(going, dtype=torch.long))
        fed = first[going]  # (G,)
        for step in range(length):
            out = model.forward(cache, fed[:, None]).logits  # (G, V)
            cost += forward_cost(model, [position + step] * len(going), produced=False)
            following, _ = argmax(chain.process(out))  # (G,)
            chain.accept(following)
            logprob = torch.log_softmax(out.float(), dim=-1).gather(1, following[:, None]).squeeze(1)  # (G,)
            index = torch.tensor(going, dtype=torch.long)
            sums.index_add_(0, index, logprob.double())
            counts.index_add_(0, index, torch.ones(len(going), dtype=torch.float64))
            for j, (i, token) in enumerate(zip(going, following.tolist())):
                rows[i].push(token, _UNRECORDED, chain.stop_verdict(j))
            still = [j for j, i in enumerate(going) if not rows[i].finished]
            if step + 1 == length or not still:
                break
            if len(still) < len(going):
                cache.select(still)
                chain.select(torch.tensor(still, dtype=torch.long))
            going, fed = [going[j] for j in still], following[still]
    finally:
        cache.restore(held)
        for snapshot in held:
            cache.release(snapshot)
    return sums, counts, cost
