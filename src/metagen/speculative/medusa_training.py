"""Training `medusa.MedusaHeads` by self-distillation on the model's own text.

Data, as the exit adapter's (`adapter.sample_training_data`): sequences the target sampled on
built-in prompts, each run once through the target (final hidden states h_t and logits at every
position). Head k (1..K) is fit to carry h_t to h_{t+k}, the state the target reads its
distribution over token t + k + 1 from:

    M_k = argmin Σ_t ‖h_t + M_k h_t − h_{t+k}‖² + λ‖M_k‖²        (ridge, `adapter.ridge_residual`)

over the training positions t ≤ T − 1 − k of every sequence. Held-out sequences measure each
head's top-1 agreement with the target's argmax at t + k (its greedy choice of token t + k + 1:
what a one-candidate head must guess for its node to be kept), before (M_k = 0: the target's
own head read k positions early) and after. Time: one target forward per sequence, then
O(N·H² + H³) per head and O(N·H·V) to measure agreement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from metagen.speculative.adapter import model_identity, ridge_residual
from metagen.speculative.medusa import MedusaHeads

__all__ = ["MedusaReport", "train_medusa_heads"]


@dataclass(frozen=True)
class MedusaReport:
    """What `train_medusa_heads` did; agreement_before / agreement_after per head (k = 1..K)."""

    num_heads: int
    parameters: int
    train_positions: int
    held_out_positions: int
    seconds: float
    agreement_before: tuple[float, ...]
    agreement_after: tuple[float, ...]


def _pairs(states: list[Tensor], argmaxes: list[Tensor], k: int) -> tuple[Tensor, Tensor, Tensor]:
    """(h_t, h_{t+k}, argmax_{t+k}) over every sequence's positions t ≤ T − 1 − k: (N, H), (N, H), (N,)."""
    inputs = [h[:-k] for h in states if len(h) > k]
    outputs = [h[k:] for h in states if len(h) > k]
    labels = [a[k:] for a, h in zip(argmaxes, states) if len(h) > k]
    return torch.cat(inputs), torch.cat(outputs), torch.cat(labels)


def _agreement(target, maps: Tensor, inputs: Tensor, labels: Tensor) -> float:
    """Share of rows where argmax lm_head(h + M h) equals the label (chunks of 512 rows)."""
    agree = 0
    for start in range(0, len(labels), 512):
        h = inputs[start : start + 512]
        logits = target.logits_from_hidden(h + h @ maps.t())  # (n, V)
        agree += int((logits.argmax(-1) == labels[start : start + 512]).sum())
    return agree / max(len(labels), 1)


@torch.no_grad()
def train_medusa_heads(target, sequences: Sequence[Sequence[int]], *, num_heads: int = 3, ridge: float = 1.0,
                       held_out: float = 0.1, seed: int = 0, identity: dict | None = None
                       ) -> tuple[MedusaHeads, MedusaReport]:
    """`MedusaHeads` for `target` fit on `sequences` (token ids; texts are tokenized as they
    are), a `held_out` share of whole sequences (at least one) kept for the report. `identity`:
    what the heads are tied to (default the target's `adapter.model_identity`; needs "hidden_size")."""
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out={held_out!r} is out of range: must be in [0, 1)")
    if not ridge > 0:
        raise ValueError(f"ridge={ridge!r} is out of range: must be > 0")
    heads = MedusaHeads(num_heads, model_identity(target) if identity is None else identity)
    sequences = [target.tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
                 for item in sequences]
    sequences = [s[: target.max_context] for s in sequences if len(s) > num_heads + 1]
    if len(sequences) < 2:
        raise ValueError(f"need at least 2 sequences of more than {num_heads + 1} tokens (one is held out), "
                         f"got {len(sequences)}")
    started = time.perf_counter()
    states, argmaxes = [], []
    for sequence in sequences:
        out = target.forward(target.new_cache(1), [sequence], logits="all", hidden=True)
        states.append(out.hidden[0].float())  # (T, H)
        argmaxes.append(out.logits[0].argmax(-1))  # (T,)
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed)).tolist()
    split = max(1, round(held_out * len(sequences)))
    test, train = order[:split], order[split:]
    before, after, counts = [], [], (0, 0)
    for k in range(1, num_heads + 1):
        inputs, outputs, _ = _pairs([states[i] for i in train], [argmaxes[i] for i in train], k)
        heads.maps[k - 1] = ridge_residual(inputs, outputs, ridge)
        test_inputs, _, test_labels = _pairs([states[i] for i in test], [argmaxes[i] for i in test], k)
        before.append(_agreement(target, torch.zeros_like(heads.maps[k - 1]), test_inputs, test_labels))
        after.append(_agreement(target, heads.maps[k - 1], test_inputs, test_labels))
        if k == 1:
            counts = (len(inputs), len(test_labels))
    report = MedusaReport(num_heads, heads.maps.numel(), counts[0], counts[1], time.perf_counter() - started,
                          tuple(before), tuple(after))
    return heads, report
