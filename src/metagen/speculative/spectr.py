r"""SpecTr's k-sequential selection (Sun et al. 2023, "SpecTr: Fast Speculative Decoding via
Optimal Transport"), as a tree verification rule: the children of a node are k drafts drawn
i.i.d. (with replacement) from the draft's p, and at most one is kept so that the token leaving
the node follows the target's q exactly.

With ρ ∈ [1, k] and β(ρ) = Σ_x min(p(x), q(x)/ρ) (one draft's acceptance probability):

    for i = 1..k:  accept x_i with prob min(1, q(x_i) / (ρ·p(x_i)))    (stop at the first)
    all rejected:  x ~ p_res,  p_res(x) ∝ q(x) − min(p(x), q(x)/ρ) · (1 − (1 − β)^k) / β

Output law: x is emitted through candidate i with prob (1 − β)^{i−1}·min(p(x), q(x)/ρ), summing
to min(p, q/ρ)·(1 − (1 − β)^k)/β, and the residual supplies the rest, (1 − β)^k·p_res = q − that:
the output is q exactly whenever p_res ≥ 0, that is whenever (1 − (1 − β(ρ))^k) ≤ ρ·β(ρ). The
left side falls and the right side (= Σ min(ρp, q)) rises with ρ, and ρ = k always qualifies
(union bound), so the acceptance 1 − (1 − β(ρ))^k is largest at the paper's

    ρ* = the smallest ρ ∈ [1, k] with 1 − (1 − β(ρ))^k ≤ ρ·β(ρ),

found here by bisection on [1, k] (`optimal_rho`; f(ρ) = ρβ(ρ) − 1 + (1 − β(ρ))^k is
increasing, 60 halvings reach float64 resolution; O(60·V)). The bracket's feasible end is
returned, so p_res is nonnegative up to rounding (clamped at 0).

Guarantee (Sun et al. 2023): with ρ*, the acceptance 1 − (1 − β(ρ*))^k is at least
(1 − 1/e) times the optimal acceptance of any valid selection from k i.i.d. drafts (the optimal
transport of p^{⊗k} to q with membership cost, `α*`), and at least the single-draft acceptance
Σ min(p, q): at ρ* > 1 it equals ρ*·β(ρ*) = Σ min(ρ*p, q) ≥ Σ min(p, q), and at ρ* = 1 it is
1 − (1 − β(1))^k ≥ β(1). With k = 1, ρ* = 1 and the rule is token verification.

In a tree (`SpecTrVerification`), the rule runs at every node from the root down, as recursive
rejection sampling does in `tree_verify`: the subtree under the kept child was drafted from that
child's path alone, so by induction the emitted sequence follows plain sampling from q. The
drafts must be i.i.d.: `TreeDrafter(replacement=True)` (registry entry `spectr`) draws each
node's k children with replacement — a repeated token is a separate child with its own subtree,
as k independent draft sequences would be — and a tree whose siblings were drawn without
replacement is refused (`Draft.iid_siblings`).
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from torch import Tensor

from metagen.decoding.batch import RowBatch
from metagen.decoding.drafts import Draft, Outcomes
from metagen.decoding.result import StreamEvent
from metagen.speculative.tree_verify import TreeVerification

__all__ = ["SpecTrVerification", "k_sequential", "optimal_rho", "spectr_plan"]

_HALVINGS = 60  # bisection steps on [1, k]: (k − 1)/2^60 is below float64 resolution at ρ ≥ 1


def _beta(q: Tensor, p: Tensor, rho: float) -> float:
    """β(ρ) = Σ min(p, q/ρ), one draft's acceptance probability. O(V)."""
    return float(torch.minimum(p, q / rho).sum())


def optimal_rho(q: Tensor, p: Tensor, k: int) -> float:
    """ρ* ∈ [1, k]: the smallest ρ with 1 − (1 − β(ρ))^k ≤ ρ·β(ρ) (module docstring), by
    bisection; q, p: (V,) float64 distributions. O(60·V)."""
    def feasible(rho: float) -> bool:
        beta = _beta(q, p, rho)
        return 1.0 - (1.0 - beta) ** k <= rho * beta

    if k == 1 or feasible(1.0):
        return 1.0
    low, high = 1.0, float(k)
    for _ in range(_HALVINGS):
        middle = 0.5 * (low + high)
        if feasible(middle):
            high = middle
        else:
            low = middle
    return high


def spectr_plan(q: Tensor, p: Tensor, k: int) -> tuple[float, Tensor, Tensor]:
    """`(ρ*, accept, residual)` for k i.i.d. drafts from p and the target q, both (V,) summing
    to 1: accept (V,) = min(1, q/(ρ*·p)) (0 where p = 0), the probability a candidate x is kept;
    residual (V,) = p_res, what the token is drawn from when all k are rejected (q itself when
    that cannot happen). Float64; inputs are not written. O(60·V)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1 (the number of i.i.d. drafts)")
    q, p = q.double(), p.double()
    rho = optimal_rho(q, p, k)
    kept = torch.minimum(p, q / rho)  # (V,) min(p, q/ρ)
    beta = float(kept.sum())
    accept = torch.where(p > 0, (q / (rho * p.clamp(min=torch.finfo(torch.float64).tiny))).clamp(max=1.0),
                         torch.zeros_like(p))
    if beta <= 0.0:  # disjoint supports: no candidate is ever kept
        return rho, accept, q.clone()
    reach = 1.0 - (1.0 - beta) ** k  # P(some candidate kept)
    residual = (q - kept * (reach / beta)).clamp(min=0)  # (V,) (1 − β)^k · p_res, up to rounding
    mass = float(residual.sum())
    return rho, accept, (residual / mass if mass > 0 else q.clone())


def k_sequential(q: Tensor, p: Tensor, candidates: list[int], u: Tensor) -> tuple[int, Tensor]:
    """One position of k-sequential selection: `(j, residual)`.

    q: (V,) target; p: (V,) the draft distribution the k = len(candidates) tokens were drawn
    from i.i.d.; u: (k,) uniforms in [0, 1). j: the first i with u_i < min(1, q(x_i)/(ρ*·p(x_i))),
    or −1 when none; residual: (V,) p_res, to draw the token from when j = −1. O(60·V + k).
    """
    _, accept, residual = spectr_plan(q, p, len(candidates))
    for j, x in enumerate(candidates):
        if float(u[j]) < float(accept[x]):
            return j, residual
    return -1, residual


class SpecTrVerification(TreeVerification):
    """Tree verification with SpecTr's k-sequential selection at each node (module docstring);
    greedy tree verification at temperature 0. Needs i.i.d. siblings (`Draft.iid_siblings`);
    chains (one child per node) verify as token verification."""

    name = "spectr"

    def verify(self, batch: RowBatch, logits: Tensor, draft: Draft) -> Generator[StreamEvent, None, Outcomes]:
        if not draft.iid_siblings:
            for b, parents in enumerate(draft.parents):
                seen: set[int] = set()
                for parent in parents:
                    if parent in seen:
                        raise ValueError(
                            f"the spectr rule needs a node's children drawn i.i.d. (with replacement), but row {b}'s "
                            f"node {parent} has several children drawn without replacement: draft with "
                            "TreeDrafter(replacement=True) (--speculative spectr) or verify with multi-draft")
                    seen.add(parent)
        return (yield from super().verify(batch, logits, draft))

    def select(self, q: Tensor, proposal: Tensor | None, candidates: list[int], u: Tensor,
               iid: bool) -> tuple[int, Tensor]:
        if proposal is None:  # a deterministic draft: one point mass per child
            if len(candidates) > 1:
                raise ValueError(f"the spectr rule got {len(candidates)} children without draft distributions: "
                                 "k-sequential selection needs k draws from one distribution")
            proposal = torch.zeros_like(q)
            proposal[candidates[0]] = 1.0
        return k_sequential(q, proposal, candidates, u)
