"""Toy draft/target models for the verification tests.

A toy model is a table `(V, V)`: row `prev` is the next-token distribution after token `prev`
(all rows equal = i.i.d. positions). Every sequence starts after context token 0, so the
target's exact joint law of the first two tokens is Q[0, a] · Q[a, b].
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import stats

CONTEXT = 0


def dirichlet_table(vocab: int, seed: int, iid: bool, concentration: float = 1.0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    rows = rng.dirichlet([concentration] * vocab, size=1 if iid else vocab)
    table = np.repeat(rows, vocab, axis=0) if iid else rows
    return torch.tensor(table, dtype=torch.float64)


def draw_block(draft_table, target_table, context, gamma, generator):
    """Drafts drawn from the draft model after `context: (B,)`; returns draft (B, γ), p, q."""
    prev, tokens, p_rows, q_rows = context, [], [], []
    for _ in range(gamma):
        p_rows.append(draft_table[prev])
        q_rows.append(target_table[prev])
        prev = torch.multinomial(draft_table[prev], 1, generator=generator).squeeze(1)
        tokens.append(prev)
    q_rows.append(target_table[prev])
    batch, vocab = context.shape[0], draft_table.shape[1]
    draft = torch.stack(tokens, 1) if gamma else torch.zeros(batch, 0, dtype=torch.long)
    p = torch.stack(p_rows, 1) if gamma else torch.zeros(batch, 0, vocab, dtype=draft_table.dtype)
    return draft, p, torch.stack(q_rows, 1)


def first_two_emitted(rule, draft_table, target_table, gamma, batch, generator):
    """(first, second, tau) of the first verification round, B sequences at once.

    When the first round emits one token only (τ = 0), a second round from that token supplies
    the second emitted token, exactly as a decoding loop would.
    """
    context = torch.full((batch,), CONTEXT, dtype=torch.long)
    draft, p, q = draw_block(draft_table, target_table, context, gamma, generator)
    tau, token = rule(draft, p, q, generator)
    first = torch.where(tau >= 1, draft[:, 0], token) if gamma else token
    second = token.clone()
    if gamma >= 2:
        second = torch.where(tau >= 2, draft[:, 1], token)
    again = tau == 0
    if bool(again.any()):
        draft2, p2, q2 = draw_block(draft_table, target_table, token[again], gamma, generator)
        tau2, token2 = rule(draft2, p2, q2, generator)
        second[again] = torch.where(tau2 >= 1, draft2[:, 0], token2) if gamma else token2
    return first, second, tau


def joint_p_value(first, second, target_table) -> float:
    """Chi-square p-value of the (first, second) counts against Q[0, a] · Q[a, b]."""
    vocab = target_table.shape[0]
    counts = torch.bincount(first * vocab + second, minlength=vocab * vocab).double()
    expected = (target_table[CONTEXT].unsqueeze(1) * target_table).flatten() * first.numel()
    impossible = expected == 0
    assert counts[impossible].sum() == 0, "a token pair the target can never emit was emitted"
    return float(stats.chisquare(counts[~impossible].numpy(), expected[~impossible].numpy()).pvalue)


def exact_mean_tau(draft_table, target_table, gamma: int, rule: str) -> float:
    """E[τ] by enumerating all V^γ drafts; an independent plain-Python form of Algorithms 1 and 2."""
    P, Q = draft_table.tolist(), target_table.tolist()
    vocab = len(P)
    total = 0.0
    for seq in itertools.product(range(vocab), repeat=gamma):
        prob, prev, running, h, keep = 1.0, CONTEXT, 1.0, [], 1.0
        for i, x in enumerate(seq):
            prob *= P[prev][x]
            if prob == 0:
                break
            ratio = Q[prev][x] / P[prev][x]
            if rule == "token":
                keep *= min(1.0, ratio)
                h.append(keep)  # P(τ ≥ i+1 | draft)
            else:
                running = min(running * ratio, 1.0)
                if i + 1 == gamma:
                    h.append(running)
                else:
                    mass = sum(max(running * Q[x][y] - P[x][y], 0.0) for y in range(vocab))
                    h.append(1.0 if running >= 1 else mass / (mass + 1 - running))
            prev = x
        if prob == 0:
            continue
        if rule == "token":
            total += prob * sum(h)
        else:  # τ ≥ t iff some η_i ≤ h_i with i ≥ t
            total += prob * sum(1 - np.prod([1 - hi for hi in h[t:]]) for t in range(gamma))
    return total
