"""Training a SpecDec++ stop head (`stop_head.StopHead`) on the model's own text.

Data, as the exit adapter's (`adapter.sample_training_data`): sequences the target sampled on
built-in prompts. Each sequence runs once through the draft (logits and hidden states at every
position) and once through the target (logits); at every position t the draft proposes x_t as
it would while drafting after that context, and the position is labelled with its rejection:

    temperature 0:  y_t = 1[argmax p_t ≠ argmax q_t]                        (greedy verification)
    temperature T:  x_t ~ p_t,  y_t = 1 − min(1, q_t(x_t) / p_t(x_t))       (soft label: the
                    rejection probability of token verification, as SpecDec++ trains on)

with p_t = softmax(z_draft / T), q_t = softmax(z_target / T) (plain temperature: the sampler
chain's other steps are left out). The contexts are the target's own text, i.e. every earlier
draft token kept — the condition under which r_i enters the stop rule. Loss (SpecDec++'s
weighted binary cross-entropy, w = `reject_weight`):

    L = −(1/N) Σ_t [ w · y_t log σ(s_t) + (1 − y_t) log(1 − σ(s_t)) ],   s_t = head logit of f_t

minimised by full-batch AdamW. Time: one draft + one target forward per sequence, then
O(steps · N · F) for the head (F = H + 2; M·F per row for an MLP).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from metagen.speculative.stop_head import EXTRA_FEATURES, StopHead, stop_features, stop_identity

__all__ = ["StopData", "StopReport", "fit_stop_head", "stop_training_data", "train_stop_head"]


@dataclass(frozen=True)
class StopData:
    """features (N, F); labels (N,) in [0, 1], the rejection (probability) of each position's
    draft token; groups (N,) the sequence each position came from (held-out splits keep
    sequences whole)."""

    features: Tensor
    labels: Tensor
    groups: Tensor


@dataclass(frozen=True)
class StopReport:
    """What `fit_stop_head` did. rejection_rate: mean label (training positions); accuracy:
    share of held-out positions where r > 0.5 agrees with y > 0.5, and `baseline_accuracy` the
    same for the constant guess of the training majority; BCE (weight 1) on held-out positions
    before (the constant training rejection rate) and after."""

    train_positions: int
    held_out_positions: int
    steps: int
    seconds: float
    rejection_rate: float
    baseline_accuracy: float
    accuracy: float
    bce_before: float
    bce_after: float


@torch.no_grad()
def stop_training_data(target, draft, sequences: Sequence[Sequence[int]], *, temperature: float = 0.0,
                       seed: int = 0) -> StopData:
    """Features and rejection labels at every position of every sequence (see the module
    docstring). `draft` must return hidden states (`forward(..., hidden=True)`)."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature!r} is out of range: must be >= 0 (0: greedy labels)")
    generator = torch.Generator().manual_seed(seed)
    features, labels, groups = [], [], []
    for index, sequence in enumerate(sequences):
        sequence = [int(t) for t in sequence]
        out = draft.forward(draft.new_cache(1), [sequence], logits="all", hidden=True)
        draft_logits, hidden = out.logits[0], out.hidden[0]  # (T, V), (T, H)
        target_logits = target.forward(target.new_cache(1), [sequence], logits="all").logits[0]  # (T, V)
        if temperature == 0:
            tokens = draft_logits.argmax(-1)  # (T,)
            label = (tokens != target_logits.argmax(-1)).float()
        else:
            p = torch.softmax(draft_logits.float() / temperature, dim=-1)
            q = torch.softmax(target_logits.float() / temperature, dim=-1)
            tokens = torch.multinomial(p, 1, generator=generator).squeeze(1)  # (T,)
            ratio = q.gather(1, tokens[:, None]) / p.gather(1, tokens[:, None])
            label = 1.0 - ratio.clamp(max=1.0).squeeze(1)
        features.append(stop_features(hidden, draft_logits, tokens))
        labels.append(label)
        groups.append(torch.full((len(tokens),), index))
    if not features:
        raise ValueError("no sequences to train a stop head on")
    return StopData(torch.cat(features), torch.cat(labels), torch.cat(groups))


def fit_stop_head(data: StopData, identity: dict, *, hidden_units: int | None = None, reject_weight: float = 1.0,
                  steps: int = 300, lr: float = 1e-2, weight_decay: float = 1e-3, held_out: float = 0.1,
                  temperature: float = 0.0, seed: int = 0) -> tuple[StopHead, StopReport]:
    """A `StopHead` fit to `data` by full-batch AdamW on the weighted BCE of the module docstring.

    held_out: share of sequences (at least one, when there are two or more) kept out for the
    report; reject_weight: w > 0 (1 keeps r calibrated, which the threshold rule assumes;
    larger stops earlier). Features are standardised with the training rows' mean and scale.
    """
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out={held_out!r} is out of range: must be in [0, 1)")
    if not reject_weight > 0:
        raise ValueError(f"reject_weight={reject_weight!r} is out of range: must be > 0")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r} must be an int >= 0")
    generator = torch.Generator().manual_seed(seed)
    names = torch.unique(data.groups)
    order = names[torch.randperm(len(names), generator=generator)]
    split = 0 if len(names) < 2 or held_out == 0 else max(1, round(held_out * len(names)))
    test = torch.isin(data.groups, order[:split])
    train_x, train_y = data.features[~test], data.labels[~test]
    test_x, test_y = (data.features[test], data.labels[test]) if split else (train_x, train_y)
    head = StopHead(data.features.shape[1], identity, hidden_units, temperature=temperature, seed=seed)
    head.tensors["mean"] = train_x.mean(0)
    head.tensors["scale"] = train_x.std(0).clamp(min=1e-4)
    rate = float(train_y.mean())
    bce_before = float(torch.nn.functional.binary_cross_entropy(
        torch.full_like(test_y, min(max(rate, 1e-6), 1 - 1e-6)), test_y))
    started = time.perf_counter()
    for tensor in head.parameters:
        tensor.requires_grad_(True)
    optimizer = torch.optim.AdamW(head.parameters, lr=lr, weight_decay=weight_decay)
    weight = torch.tensor(float(reject_weight))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head.logit(train_x), train_y, pos_weight=weight)
        loss.backward()
        optimizer.step()
    for tensor in head.parameters:
        tensor.requires_grad_(False)
    seconds = time.perf_counter() - started
    predicted = head(test_x)
    accuracy = float(((predicted > 0.5) == (test_y > 0.5)).float().mean())
    baseline = float(((test_y > 0.5) == (rate > 0.5)).float().mean())
    bce_after = float(torch.nn.functional.binary_cross_entropy(predicted.clamp(1e-6, 1 - 1e-6), test_y))
    report = StopReport(len(train_y), len(test_y) if split else 0, steps, seconds, rate, baseline, accuracy,
                        bce_before, bce_after)
    return head, report


def train_stop_head(target, draft, sequences: Sequence[Sequence[int]], *, temperature: float = 0.0, seed: int = 0,
                    **fit) -> tuple[StopHead, StopReport]:
    """`stop_training_data` then `fit_stop_head` (keyword arguments `fit`), tied to `target` and
    `draft` (`stop_head.stop_identity`): a stop head for drafting with `draft` for `target`."""
    sequences = [list(s)[: min(target.max_context, draft.max_context)] for s in sequences if len(s) >= 2]
    data = stop_training_data(target, draft, sequences, temperature=temperature, seed=seed)
    if data.features.shape[1] != draft.config.hidden_size + EXTRA_FEATURES:
        raise ValueError(f"the draft's hidden states have {data.features.shape[1] - EXTRA_FEATURES} values, its "
                         f"config says {draft.config.hidden_size}")
    return fit_stop_head(data, stop_identity(target, draft), temperature=temperature, seed=seed, **fit)
