"""SpecTr's k-sequential selection: the output law is q exactly (by enumerating every k-tuple of
i.i.d. drafts, and by chi-square on samples), its acceptance lies between (1 − 1/e) times the
optimal k-draft transport (a linear program over the joint of drafts and output) and that
optimum, and never below one draft's; as the `spectr` tree rule in the loop, whole sequences
follow plain sampling and greedy equals plain greedy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.optimize import linprog

from metagen.decoding import generate
from metagen.decoding.drafts import Draft
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.spectr import SpecTrVerification, k_sequential, optimal_rho, spectr_plan
from metagen.speculative.tree_drafter import TreeDrafter

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, C, ToyModel
from tests.speculative.helpers import dirichlet_table
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import DraftTreeToyModel, TreeToyModel

SPECTR = SpeculativeConfig(num_draft_tokens=3, verify="spectr")


def pairs():
    """(p, q) toy pairs, float64 (V,): Dirichlet draws of several sharpness, and a hand pair."""
    out = [(torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64), torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64))]
    for seed, (vocab, concentration) in enumerate([(3, 1.0), (4, 0.5), (4, 2.0), (5, 0.3)]):
        p = dirichlet_table(vocab, 300 + seed, iid=True, concentration=concentration)[0]
        q = dirichlet_table(vocab, 400 + seed, iid=True, concentration=concentration)[0]
        out.append((p, q))
    return out


def enumerated_law(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[np.ndarray, float]:
    """(output law (V,), acceptance) of k-sequential selection, summed over all V^k draft tuples
    with the plan's per-candidate acceptance and residual (Python floats, no shortcut)."""
    _, accept, residual = spectr_plan(q, p, k)
    P, A, R = p.tolist(), accept.tolist(), residual.tolist()
    vocab = len(P)
    law, accepted = np.zeros(vocab), 0.0
    for drafts in itertools.product(range(vocab), repeat=k):
        weight = math.prod(P[x] for x in drafts)
        rejected = 1.0  # P(candidates before i all rejected)
        for x in drafts:
            law[x] += weight * rejected * A[x]
            accepted += weight * rejected * A[x]
            rejected *= 1.0 - A[x]
        law += weight * rejected * np.asarray(R)
    return law, accepted


def optimal_acceptance(p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """max P(Y ∈ {X_1..X_k}) over couplings of X ~ p^{⊗k} and Y ~ q: an LP over π(drafts, y)."""
    P, Q = p.tolist(), q.tolist()
    vocab = len(P)
    tuples = list(itertools.product(range(vocab), repeat=k))
    variables = len(tuples) * vocab  # π[t, y] at t·V + y
    gain = np.array([-(y in t) for t in tuples for y in range(vocab)], dtype=float)  # maximise the hit mass
    rows, rhs = [], []
    for i, t in enumerate(tuples):  # Σ_y π[t, y] = p^{⊗k}(t)
        row = np.zeros(variables)
        row[i * vocab:(i + 1) * vocab] = 1.0
        rows.append(row)
        rhs.append(math.prod(P[x] for x in t))
    for y in range(vocab - 1):  # Σ_t π[t, y] = q(y); the last one follows (and would only add rounding)
        row = np.zeros(variables)
        row[y::vocab] = 1.0
        rows.append(row)
        rhs.append(Q[y])
    result = linprog(gain, A_eq=np.array(rows), b_eq=np.array(rhs), bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return -result.fun


def min_cut_bound(p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """min over token sets Ω of q(Ω^c) + 1 − (1 − p(Ω))^k: P(Y ∈ {X}) ≤ P(Y ∉ Ω) + P(some X_i ∈ Ω)."""
    P, Q = p.tolist(), q.tolist()
    vocab = len(P)
    best = 1.0
    for size in range(vocab + 1):
        for omega in itertools.combinations(range(vocab), size):
            q_out = 1.0 - sum(Q[x] for x in omega)
            best = min(best, q_out + 1.0 - (1.0 - sum(P[x] for x in omega)) ** k)
    return best


# ------------------------------------------------------------------------ one position


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("case", range(5))
def test_the_output_law_is_q_exactly(case, k):
    p, q = pairs()[case]
    law, accepted = enumerated_law(p, q, k)
    assert np.abs(law - q.numpy()).max() < 1e-9
    rho = optimal_rho(q, p, k)
    beta = float(torch.minimum(p, q / rho).sum())
    assert accepted == pytest.approx(1 - (1 - beta) ** k, abs=1e-12)
    assert 1.0 <= rho <= k


@pytest.mark.parametrize("case", range(5))
def test_rho_is_the_smallest_with_a_nonnegative_residual(case):
    p, q = pairs()[case]
    for k in (2, 3, 5):
        rho = optimal_rho(q, p, k)

        def gap(r):  # ρβ(ρ) − (1 − (1 − β(ρ))^k), ≥ 0 exactly when the residual is nonnegative
            beta = float(torch.minimum(p, q / r).sum())
            return r * beta - (1 - (1 - beta) ** k)

        assert gap(rho) >= -1e-15
        if rho > 1.0:
            assert gap(rho) < 1e-12 and gap(max(1.0, rho - 1e-6)) < 0


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("case", range(5))
def test_acceptance_is_within_one_minus_one_over_e_of_the_optimal_transport(case, k):
    p, q = pairs()[case]
    if len(p) ** k > 200:
        pytest.skip("LP too large for a unit test")
    optimum = optimal_acceptance(p, q, k)
    assert optimum == pytest.approx(min_cut_bound(p, q, k), abs=1e-7)  # the LP meets the cut bound
    _, accepted = enumerated_law(p, q, k)
    single = float(torch.minimum(p, q).sum())
    assert (1 - 1 / math.e) * optimum - 1e-9 <= accepted <= optimum + 1e-9
    assert accepted >= single - 1e-12
    if k >= 2 and optimum > single + 1e-6:
        assert accepted > single  # more drafts help where the optimum says they can


def test_sampled_outputs_follow_q():
    generator = torch.Generator().manual_seed(5)
    for p, q in pairs()[:3]:
        k, samples = 3, 6000
        drafts = torch.multinomial(p.expand(samples, len(p)), k, replacement=True, generator=generator)  # (N, k)
        outputs = []
        for row in drafts.tolist():
            u = torch.rand(k, generator=generator, dtype=torch.float64)
            j, residual = k_sequential(q, p, row, u)
            outputs.append(row[j] if j >= 0 else int(torch.multinomial(residual, 1, generator=generator)))
        counts = np.bincount(outputs, minlength=len(q))
        assert stats.chisquare(counts, q.numpy() * samples).pvalue > 1e-3


def test_the_first_candidate_under_its_acceptance_is_kept():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    rho, accept, _ = spectr_plan(q, p, 2)
    assert accept[1] == 1.0 and accept[0] == pytest.approx(0.2 / (rho * 0.6))
    below = float(accept[0]) - 1e-3
    assert k_sequential(q, p, [0, 1], torch.tensor([below, 0.0]))[0] == 0
    assert k_sequential(q, p, [0, 1], torch.tensor([below + 2e-3, 0.99]))[0] == 1
    assert k_sequential(q, p, [0, 0], torch.tensor([0.999, 0.999]))[0] == -1
    copies = p.clone(), q.clone()
    spectr_plan(q, p, 3)
    assert torch.equal(copies[0], p) and torch.equal(copies[1], q)
    with pytest.raises(ValueError, match="k=0 must be an int >= 1"):
        spectr_plan(q, p, 0)


# ------------------------------------------------------------------------ in the loop


def iid_drafter(widths=(2, 2, 1), max_nodes=16, replacement=True):
    return TreeDrafter(DraftTreeToyModel(), widths=widths, max_nodes=max_nodes, replacement=replacement)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("widths", [(2, 2, 1), (3,)])
def test_spectr_trees_follow_the_target_distribution(widths):
    params = SamplingParams(n=3000, max_tokens=4, seed=17)
    result = speculative_generate(TreeToyModel(), iid_drafter(widths), PROMPT, params, SPECTR)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.usefixtures("one_thread")
def test_spectr_with_penalties_follows_the_target_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=3, temperature=0.8, repetition_penalty=1.5)
    result = speculative_generate(TreeToyModel(), iid_drafter(), PROMPT, params, SPECTR)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, C]])
def test_spectr_greedy_equals_plain_greedy(prompt):
    params = SamplingParams(temperature=0, max_tokens=7)
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(TreeToyModel(), iid_drafter(), prompt, params, SPECTR).completions[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason


def test_spectr_refuses_trees_drawn_without_replacement():
    with pytest.raises(ValueError, match="verify='spectr' needs a node's children drawn i.i.d."):
        speculative_generate(TreeToyModel(), iid_drafter(replacement=False), PROMPT, SamplingParams(max_tokens=3),
                             SPECTR)
    tree = Draft([[1, 2]], [[-1, -1]], [torch.full((2, 5), 0.2)])  # siblings drawn without replacement
    with pytest.raises(ValueError, match="row 0's node -1 has several children drawn without replacement"):
        next(SpecTrVerification().verify(None, torch.zeros(1, 3, 5), tree))


@pytest.mark.usefixtures("one_thread")
def test_iid_siblings_may_repeat_and_the_multi_draft_rule_verifies_them_too():
    """With replacement a token can be drawn twice at a node (each copy its own subtree); the
    multi-draft rule reads `iid_siblings` and runs recursive rejection sampling's i.i.d. form."""
    drafter = iid_drafter((3,))
    params = SamplingParams(n=3000, max_tokens=4, seed=8)
    result = speculative_generate(TreeToyModel(), drafter, PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3, verify="multi-draft"))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    from metagen.sampling import SamplerChain

    chain = SamplerChain.from_params(SamplingParams(temperature=1.0), 1, 5)
    drafter.start(PROMPT, 1)
    generator = torch.Generator().manual_seed(0)
    repeats = 0
    for _ in range(40):
        draft = drafter.propose([PROMPT], [1], chain, generator)
        assert draft.iid_siblings and len(draft.tokens[0]) == 3 and draft.parents[0] == [-1, -1, -1]
        repeats += len(set(draft.tokens[0])) < 3
    assert repeats > 0
