"""Distributional and exact tests of token, block and greedy verification."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.speculative import block_verify, greedy_verify, token_verify
from tests.speculative.helpers import (
    dirichlet_table,
    draw_block,
    exact_mean_tau,
    first_two_emitted,
    joint_p_value,
)

RULES = {"token": token_verify, "block": block_verify}
BATCH = 40_000


def support_mismatch_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Context-dependent toy pair with zeros where the other model has mass (V = 4)."""
    draft = torch.tensor(
        [[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]],
        dtype=torch.float64,
    )
    target = torch.tensor(
        [[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.25, 0.25], [0.6, 0.1, 0.1, 0.2], [0.2, 0.2, 0.3, 0.3]],
        dtype=torch.float64,
    )
    return draft, target


CASES = {
    "iid": lambda: (dirichlet_table(5, 1, iid=True), dirichlet_table(5, 2, iid=True)),
    "context": lambda: (dirichlet_table(4, 3, iid=False), dirichlet_table(4, 4, iid=False)),
    "support_mismatch": support_mismatch_tables,
}


@pytest.mark.parametrize("gamma", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("rule", sorted(RULES))
def test_first_two_emitted_tokens_follow_target(rule, case, gamma):
    draft_table, target_table = CASES[case]()
    generator = torch.Generator().manual_seed(11)
    first, second, _ = first_two_emitted(RULES[rule], draft_table, target_table, gamma, BATCH, generator)
    assert joint_p_value(first, second, target_table) > 1e-3


def test_a_biased_rule_fails_the_chi_square_check():
    # Guard that the test above can fail: accepting every draft token emits the draft's law.
    draft_table, target_table = CASES["context"]()

    def accept_all(draft, p, q, generator):
        tau = torch.full((draft.shape[0],), draft.shape[1])
        return tau, torch.multinomial(q[:, -1], 1, generator=generator).squeeze(1)

    generator = torch.Generator().manual_seed(11)
    first, second, _ = first_two_emitted(accept_all, draft_table, target_table, 2, BATCH, generator)
    assert joint_p_value(first, second, target_table) < 1e-6


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_accepts_at_least_as_many_tokens_as_token_verification(case):
    draft_table, target_table = CASES[case]()
    gamma = 4
    exact = {rule: exact_mean_tau(draft_table, target_table, gamma, rule) for rule in RULES}
    assert exact["block"] >= exact["token"] - 1e-12
    for rule, verify in RULES.items():
        generator = torch.Generator().manual_seed(5)
        _, _, tau = first_two_emitted(verify, draft_table, target_table, gamma, BATCH, generator)
        mean, sem = tau.double().mean().item(), tau.double().std().item() / math.sqrt(BATCH)
        assert abs(mean - exact[rule]) < 4 * sem + 1e-9, (rule, mean, exact[rule])


def test_block_gains_on_a_case_where_it_should():
    # i.i.d. positions with p ≠ q: block verification recovers part of token verification's losses.
    draft_table, target_table = CASES["iid"]()
    token_mean = exact_mean_tau(draft_table, target_table, 4, "token")
    block_mean = exact_mean_tau(draft_table, target_table, 4, "block")
    assert block_mean > token_mean * 1.01


@pytest.mark.parametrize("rule", sorted(RULES))
def test_one_token_acceptance_rate_is_one_minus_total_variation(rule):
    draft_row = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    target_row = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    exact = 1 - 0.5 * (draft_row - target_row).abs().sum().item()  # Σ min(p, q) = 0.6
    assert exact == pytest.approx(0.6)
    generator = torch.Generator().manual_seed(3)
    draft = torch.multinomial(draft_row, BATCH, replacement=True, generator=generator).unsqueeze(1)
    p = draft_row.expand(BATCH, 1, 4)
    q = target_row.expand(BATCH, 2, 4)
    tau, _ = RULES[rule](draft, p, q, generator)
    rate = tau.double().mean().item()
    assert abs(rate - exact) < 4 * math.sqrt(exact * (1 - exact) / BATCH)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_equal_models_accept_everything(rule):
    row = torch.tensor([0.25, 0.25, 0.5])
    draft = torch.tensor([2, 0, 1])
    tau, token = RULES[rule](draft, row.expand(3, 3), row.expand(4, 3), torch.Generator().manual_seed(0))
    assert tau.item() == 3 and tau.shape == () and token.shape == ()


@pytest.mark.parametrize("rule", sorted(RULES))
def test_zero_target_mass_on_a_draft_token_rejects_it(rule):
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        tau, token = RULES[rule](torch.tensor([0, 0]), p, q, generator)
        # x_1 = 0 has q = 0, so under either rule τ = 0 and the token comes from norm(max(0, q − p)) = e_2.
        assert (tau.item(), token.item()) == (0, 2)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_gamma_zero_samples_from_the_target(rule):
    q = torch.tensor([[0.0, 1.0, 0.0]])
    tau, token = RULES[rule](torch.zeros(0, dtype=torch.long), torch.zeros(0, 3), q)
    assert (tau.item(), token.item()) == (0, 1)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_inputs_are_not_modified(rule):
    generator = torch.Generator().manual_seed(0)
    draft_table, target_table = CASES["context"]()
    draft, p, q = draw_block(draft_table, target_table, torch.zeros(8, dtype=torch.long), 3, generator)
    copies = [draft.clone(), p.clone(), q.clone()]
    tau, token = RULES[rule](draft, p, q, generator)
    assert tau.shape == (8,) and token.shape == (8,)
    for before, after in zip(copies, (draft, p, q)):
        assert torch.equal(before, after)


def test_greedy_verify_exact_cases():
    q = torch.tensor([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]])
    assert [t.item() for t in greedy_verify(torch.tensor([1, 0, 2]), q)] == [3, 2]
    assert [t.item() for t in greedy_verify(torch.tensor([1, 0, 1]), q)] == [2, 2]
    assert [t.item() for t in greedy_verify(torch.tensor([1, 2, 2]), q)] == [1, 0]
    assert [t.item() for t in greedy_verify(torch.tensor([0, 0, 2]), q)] == [0, 1]
    assert [t.item() for t in greedy_verify(torch.zeros(0, dtype=torch.long), q[:1])] == [0, 1]
    tau, token = greedy_verify(torch.tensor([[1, 0, 2], [0, 0, 2]]), q.expand(2, 4, 3))
    assert tau.tolist() == [3, 0] and token.tolist() == [2, 1]


GOOD_P = torch.full((2, 3), 1 / 3)
GOOD_Q = torch.full((3, 3), 1 / 3)
GOOD_DRAFT = torch.tensor([0, 1])


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize(
    "draft, p, q, message",
    [
        (GOOD_DRAFT.float(), GOOD_P, GOOD_Q, "draft must be an integer"),
        (GOOD_DRAFT.view(1, 1, 2), GOOD_P, GOOD_Q, r"draft must have shape \(γ,\)"),
        (GOOD_DRAFT, GOOD_P, GOOD_Q[:2], r"q must have shape \(γ\+1, V\)"),
        (GOOD_DRAFT, GOOD_P[:1], GOOD_Q, r"p must have shape \(γ, V\)"),
        (GOOD_DRAFT, GOOD_P, GOOD_Q * 2, "q rows must sum to 1"),
        (GOOD_DRAFT, -GOOD_P, GOOD_Q, "p must hold finite non-negative"),
        (torch.tensor([0, 3]), GOOD_P, GOOD_Q, r"draft tokens must lie in \[0, V\)"),
    ],
)
def test_invalid_inputs_raise(rule, draft, p, q, message):
    with pytest.raises(ValueError, match=message):
        RULES[rule](draft, p, q, None)


def test_greedy_verify_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"q must have shape \(γ\+1, V\)"):
        greedy_verify(GOOD_DRAFT, GOOD_Q[:2])
    with pytest.raises(ValueError, match="draft must be an integer"):
        greedy_verify(GOOD_DRAFT.float(), GOOD_Q)


def test_block_never_stops_where_equation_4_gives_zero():
    # x_1 = 0 has ratio 0.4, so p_1 = 0.4 and q[1] = p[1] give S_1 = Σ max(0.4·q[1] − p[1], 0) = 0:
    # h_1 = 0, τ = 1 is impossible, p_2 = h_2 = 0.4, and τ = 0 samples from max(0, q[0] − p[0]) = e_1.
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.8, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], dtype=torch.float64)
    batch = 20_000
    draft = torch.tensor([0, 2]).expand(batch, 2)
    tau, token = block_verify(draft, p.expand(batch, 2, 3), q.expand(batch, 3, 3), torch.Generator().manual_seed(2))
    assert set(tau.tolist()) == {0, 2}
    assert (token[tau == 0] == 1).all()
    rate = (tau == 2).double().mean().item()
    assert abs(rate - 0.4) < 4 * math.sqrt(0.24 / batch)
    # token verification on the same draft stops at the rejection of x_1 or accepts both
    tau_token, _ = token_verify(draft, p.expand(batch, 2, 3), q.expand(batch, 3, 3), torch.Generator().manual_seed(2))
    assert set(tau_token.tolist()) == {0, 2}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_float32_softmax_rows_of_a_large_vocabulary(rule):
    generator = torch.Generator().manual_seed(0)
    batch, gamma, vocab = 4, 5, 32_000
    p = torch.randn(batch, gamma, vocab, generator=generator).softmax(-1)
    q = torch.randn(batch, gamma + 1, vocab, generator=generator).softmax(-1)
    draft = torch.multinomial(p.view(-1, vocab), 1, generator=generator).view(batch, gamma)
    tau, token = RULES[rule](draft, p, q, generator)
    assert tau.dtype == torch.long and ((tau >= 0) & (tau <= gamma)).all()
    assert token.shape == (batch,) and ((token >= 0) & (token < vocab)).all()
