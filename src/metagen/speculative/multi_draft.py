"""Multi-draft verification by recursive rejection sampling (Jeon et al. 2024, "Recursive
Speculative Decoding"; the i.i.d. form is SpecInfer's multi-step speculative sampling).

k drafts share the context, so their first tokens are k candidates for one position. Candidate j
(token x_j) is accepted with probability min(1, q_j(x_j)/p_j(x_j)); on rejection

    q_{j+1} = norm(max(0, q_j − p_j))                                   (residual target)
    p_{j+1} = norm(p_j with x_j removed)      without replacement (default)
    p_{j+1} = p_j                             i.i.d. candidates

starting from q_1 = q[0], p_1 = p[0]. If all k are rejected the token is drawn from q_{k+1}. Each
step is a maximal coupling of p_j and q_j, and the candidate tried at step j is distributed as p_j
given the earlier ones, so the emitted first token follows q[0] exactly. Drawing without
replacement (torch.multinomial(p, k, replacement=False)) never wastes a candidate on a token
already rejected, so it accepts at least as often as i.i.d. drafts, which accept at least as often
as one draft. After an acceptance the accepted draft's remaining tokens were drawn from p given
its own prefix independently of the other drafts, so they are verified by plain token
verification along that draft (a chain, not a tree): the whole emitted sequence follows q.
"""

from __future__ import annotations

import torch
from torch import Tensor

from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import check_probabilities


def multi_draft_verify(
    drafts: Tensor,
    p: Tensor,
    q: Tensor,
    generator: torch.Generator | None = None,
    without_replacement: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Verify k drafts of length γ; return `(draft_index, tau, token)`.

    drafts: (k, γ) Long, first tokens drawn from p[0, 0] without replacement (or i.i.d. when
    `without_replacement=False`), draft j's later tokens drawn from p[j, i] (its own context);
    p: (k, γ, V) draft distributions, q: (k, γ+1, V) target distributions along each draft
    (rows 0 of p and of q must agree across drafts: same context).
    Returns draft_index: () the draft whose prefix was accepted (−1 when τ = 0), tau: () accepted
    tokens of that draft, token: () the correction or bonus token after them.
    Guarantee: (drafts[draft_index, :tau], token) is distributed as the target q's continuation.
    Time complexity: O(k·V) for the first position plus O(γ·V) along the chosen draft.
    """
    is_integer = isinstance(drafts, Tensor) and drafts.dtype in (torch.int64, torch.int32)
    if not is_integer or drafts.dim() != 2:
        raise ValueError("drafts must be an integer (Long) tensor of shape (k, γ)")
    k, gamma = drafts.shape
    if k == 0:
        raise ValueError("drafts must have shape (k, γ) with k >= 1, got k = 0")
    if not isinstance(q, Tensor) or q.dim() != 3 or q.shape[:2] != (k, gamma + 1) or q.shape[2] == 0:
        got = tuple(getattr(q, "shape", ()))
        raise ValueError(f"q must have shape (k, γ+1, V) = ({k}, {gamma + 1}, V), got {got}")
    vocab = q.shape[2]
    if not isinstance(p, Tensor) or p.shape != (k, gamma, vocab):
        got = tuple(getattr(p, "shape", ()))
        raise ValueError(f"p must have shape (k, γ, V) = ({k}, {gamma}, {vocab}), got {got}")
    check_probabilities("q", q, "(k, γ+1, V)")
    check_probabilities("p", p, "(k, γ, V)")
    if gamma and (bool((drafts < 0).any()) or bool((drafts >= vocab).any())):
        raise ValueError(f"drafts tokens must lie in [0, V) = [0, {vocab})")
    same_q = torch.allclose(q[:, 0], q[:1, 0].expand(k, vocab))
    same_p = gamma == 0 or torch.allclose(p[:, 0], p[:1, 0].expand(k, vocab))
    if not (same_q and same_p):
        raise ValueError("p[:, 0] and q[:, 0] must be equal across drafts (k drafts share one context)")
    minus_one = torch.tensor(-1)
    if gamma == 0:
        return minus_one, torch.tensor(0), torch.multinomial(q[0, 0], 1, generator=generator).squeeze()

    candidates = [int(x) for x in drafts[:, 0]]
    u = torch.rand(k, generator=generator, dtype=torch.float64)
    j, target = recursive_rejection(q[0, 0], p[0, 0], candidates, u, without_replacement)
    if j >= 0:
        tail_tau, token = token_verify(drafts[j, 1:], p[j, 1:], q[j, 1:], generator)
        return torch.tensor(j), 1 + tail_tau, token
    return minus_one, torch.tensor(0), torch.multinomial(target, 1, generator=generator).squeeze()


def recursive_rejection(target: Tensor, proposal: Tensor | None, candidates: list[int], u: Tensor,
                        without_replacement: bool = True) -> tuple[int, Tensor]:
    """One position of recursive rejection sampling: `(j, residual)`.

    target: (V,) q_1; proposal: (V,) p_1 the candidates were drawn from (without replacement
    when `without_replacement`, else i.i.d.), or None for fixed candidates (each candidate j its
    own point mass p_j = δ(x_j): accepted with prob q_j(x_j), residual q_j with x_j removed);
    candidates: the k tokens x_1..x_k in the order tried; u: (k,) uniforms in [0, 1).
    j: the accepted candidate's index, or −1 when all were rejected; residual: (V,) q_{k+1},
    the distribution to draw the token from when j = −1 (q_j at acceptance otherwise, unused).
    Inputs are not written. Time complexity: O(k·V).
    """
    target = target.double().clone()  # q_j: (V,)
    if proposal is not None:
        proposal = proposal.double().clone()  # p_j: (V,)
    for j, x in enumerate(candidates):
        p_x = 1.0 if proposal is None else float(proposal[x])
        # accept with prob min(1, q_j(x)/p_j(x)), written as u·p_j(x) < q_j(x)
        if float(u[j]) * p_x < float(target[x]):
            return j, target
        if proposal is None:  # q_{j+1} ∝ max(0, q_j − δ(x_j)): q_j without x_j
            residual = target.clone()
            residual[x] = 0.0
        else:
            residual = (target - proposal).clamp(min=0)  # q_{j+1} ∝ max(0, q_j − p_j)
        mass = residual.sum()
        # Zero mass means q_j = p_j, where every candidate drawn from p_j is accepted: a guard only.
        target = residual / mass if mass > 0 else target
        if proposal is not None and without_replacement:
            proposal[x] = 0.0
            left = proposal.sum()
            if left <= 0:  # every token tried: only reachable with inconsistent drafts
                break
            proposal = proposal / left
    return -1, target
