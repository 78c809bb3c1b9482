"""Multi-draft recursive rejection sampling: lossless, and accepts more often than one draft."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from metagen.speculative import multi_draft_verify
from tests.speculative.helpers import CONTEXT, dirichlet_table, joint_p_value

SAMPLES = 12_000


def draw_drafts(draft_table, target_table, context: int, k: int, gamma: int, count: int, generator, without_replacement):
    """`count` sets of k drafts after `context`: drafts (N, k, γ), p (N, k, γ, V), q (N, k, γ+1, V)."""
    vocab = draft_table.shape[1]
    first = torch.multinomial(draft_table[context].expand(count, vocab), k, replacement=not without_replacement, generator=generator)
    prev = first.flatten()  # (N·k,)
    tokens, p_rows, q_rows = [prev], [draft_table[context].expand(count * k, vocab)], [target_table[context].expand(count * k, vocab)]
    for _ in range(gamma - 1):
        p_rows.append(draft_table[prev])
        q_rows.append(target_table[prev])
        prev = torch.multinomial(draft_table[prev], 1, generator=generator).squeeze(1)
        tokens.append(prev)
    q_rows.append(target_table[prev])
    shape = (count, k)
    return (
        torch.stack(tokens, 1).view(*shape, gamma),
        torch.stack(p_rows, 1).view(*shape, gamma, vocab),
        torch.stack(q_rows, 1).view(*shape, gamma + 1, vocab),
    )


def one_round(draft_table, target_table, contexts, k, gamma, generator, without_replacement):
    """Emitted tokens (list per sample) of one multi-draft round after each context token."""
    emitted = []
    for context in contexts:
        drafts, p, q = draw_drafts(draft_table, target_table, context, k, gamma, 1, generator, without_replacement)
        index, tau, token = multi_draft_verify(drafts[0], p[0], q[0], generator, without_replacement)
        accepted = drafts[0, index, : int(tau)].tolist() if int(tau) else []
        emitted.append(accepted + [int(token)])
    return emitted


def exact_first_acceptance(draft_row, target_row, k: int, without_replacement: bool) -> float:
    """P(some candidate accepted) by enumerating the candidates tried, as the module docstring defines."""

    def recurse(target, proposal, left):
        if left == 0:
            return 0.0
        total = 0.0
        for x in np.flatnonzero(proposal > 0):
            accept = min(1.0, target[x] / proposal[x])
            residual = np.maximum(target - proposal, 0)
            next_target = residual / residual.sum() if residual.sum() > 0 else target
            next_proposal = proposal.copy()
            if without_replacement:
                next_proposal[x] = 0
                if next_proposal.sum() == 0:
                    total += proposal[x] * accept
                    continue
                next_proposal /= next_proposal.sum()
            total += proposal[x] * (accept + (1 - accept) * recurse(next_target, next_proposal, left - 1))
        return total

    return recurse(np.asarray(target_row, float), np.asarray(draft_row, float), k)


CASES = {
    "iid": lambda: (dirichlet_table(4, 21, iid=True), dirichlet_table(4, 22, iid=True)),
    "context": lambda: (dirichlet_table(4, 23, iid=False), dirichlet_table(4, 24, iid=False)),
}


@pytest.mark.parametrize(
    "case, without_replacement", [("iid", True), ("context", True), ("context", False)]
)
def test_first_two_emitted_tokens_follow_target(case, without_replacement):
    draft_table, target_table = CASES[case]()
    generator = torch.Generator().manual_seed(7)
    k, gamma = 3, 2
    emitted = one_round(draft_table, target_table, [CONTEXT] * SAMPLES, k, gamma, generator, without_replacement)
    short = [i for i, tokens in enumerate(emitted) if len(tokens) == 1]
    more = one_round(draft_table, target_table, [emitted[i][0] for i in short], k, gamma, generator, without_replacement)
    for i, tokens in zip(short, more):
        emitted[i].append(tokens[0])
    first = torch.tensor([tokens[0] for tokens in emitted])
    second = torch.tensor([tokens[1] for tokens in emitted])
    assert joint_p_value(first, second, target_table) > 1e-3


@pytest.mark.parametrize("without_replacement", [True, False])
def test_more_drafts_accept_more_often(without_replacement):
    draft_table, target_table = CASES["iid"]()
    draft_row, target_row = draft_table[0], target_table[0]
    one_draft = 1 - 0.5 * (draft_row - target_row).abs().sum().item()  # 1 − TV(p, q)
    assert exact_first_acceptance(draft_row, target_row, 1, without_replacement) == pytest.approx(one_draft)
    exact = exact_first_acceptance(draft_row, target_row, 3, without_replacement)
    assert exact > one_draft + 0.05
    generator = torch.Generator().manual_seed(9)
    drafts, p, q = draw_drafts(draft_table, target_table, CONTEXT, 3, 1, SAMPLES, generator, without_replacement)
    accepted = sum(int(multi_draft_verify(drafts[n], p[n], q[n], generator, without_replacement)[1]) for n in range(SAMPLES))
    rate = accepted / SAMPLES
    assert abs(rate - exact) < 4 * math.sqrt(exact * (1 - exact) / SAMPLES)


def test_without_replacement_accepts_at_least_as_often_as_iid():
    for seed in range(5):
        draft_row = dirichlet_table(5, 100 + seed, iid=True, concentration=0.5)[0]
        target_row = dirichlet_table(5, 200 + seed, iid=True, concentration=0.5)[0]
        for k in (2, 3):
            distinct = exact_first_acceptance(draft_row, target_row, k, True)
            iid = exact_first_acceptance(draft_row, target_row, k, False)
            assert distinct >= iid - 1e-12


def test_return_values_and_rejection_of_everything():
    p = torch.tensor([[[1.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]]])
    q = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
    index, tau, token = multi_draft_verify(torch.tensor([[0], [0]]), p, q, torch.Generator().manual_seed(0), False)
    assert (index.item(), tau.item()) == (-1, 0) and token.item() in (1, 2)
    q_same = p.new_tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]]).expand(2, 2, 3)
    index, tau, token = multi_draft_verify(torch.tensor([[0], [0]]), p, q_same, None, False)
    assert (index.item(), tau.item(), token.item()) == (0, 1, 2)


def test_inputs_are_not_modified():
    draft_table, target_table = CASES["context"]()
    drafts, p, q = draw_drafts(draft_table, target_table, CONTEXT, 3, 2, 1, torch.Generator().manual_seed(0), True)
    copies = [t.clone() for t in (drafts, p, q)]
    multi_draft_verify(drafts[0], p[0], q[0], torch.Generator().manual_seed(1))
    for before, after in zip(copies, (drafts, p, q)):
        assert torch.equal(before, after)


P = torch.full((2, 2, 3), 1 / 3)
Q = torch.full((2, 3, 3), 1 / 3)
DRAFTS = torch.tensor([[0, 1], [1, 2]])


@pytest.mark.parametrize(
    "drafts, p, q, message",
    [
        (DRAFTS[0], P, Q, r"drafts must be an integer \(Long\) tensor of shape \(k, γ\)"),
        (DRAFTS.float(), P, Q, "drafts must be an integer"),
        (DRAFTS[:0], P[:0], Q[:0], "k >= 1"),
        (DRAFTS, P, Q[:, :2], r"q must have shape \(k, γ\+1, V\)"),
        (DRAFTS, P[:, :1], Q, r"p must have shape \(k, γ, V\)"),
        (DRAFTS, P * 2, Q, "p rows must sum to 1"),
        (DRAFTS + 2, P, Q, r"drafts tokens must lie in \[0, V\)"),
        (DRAFTS, P, torch.stack([Q[0], Q[1].roll(1, 0) * 0 + torch.tensor([0.5, 0.25, 0.25])]), "equal across drafts"),
    ],
)
def test_invalid_inputs_raise(drafts, p, q, message):
    with pytest.raises(ValueError, match=message):
        multi_draft_verify(drafts, p, q)
