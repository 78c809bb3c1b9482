"""Properties of the truncations on random logits (hypothesis)."""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from metagen.sampling import epsilon, eta, min_p, top_k, top_p, typical

NEG_INF = float("-inf")

logit_lists = st.lists(
    st.one_of(st.floats(-30, 30, allow_nan=False, width=32), st.just(NEG_INF)),
    min_size=1,
    max_size=12,
).filter(lambda row: any(math.isfinite(x) for x in row))
fractions = st.floats(0.001, 1.0, exclude_max=True)

TRUNCATIONS = {
    "top_k": (lambda x, q: top_k(x, max(1, int(q * 12)))),
    "top_p": (lambda x, q: top_p(x, q)),
    "min_p": (lambda x, q: min_p(x, q)),
    "epsilon": (lambda x, q: epsilon(x, q)),
    "eta": (lambda x, q: eta(x, q)),
    "typical": (lambda x, q: typical(x, q)),
}
KEEP_ARGMAX = ("top_k", "top_p", "min_p", "epsilon", "eta")
SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(row=logit_lists, q=fractions, name=st.sampled_from(sorted(TRUNCATIONS)))
def test_truncation_keeps_values_or_removes(row: list[float], q: float, name: str) -> None:
    logits = torch.tensor(row)
    out = TRUNCATIONS[name](logits, q)
    kept = torch.isfinite(out)
    assert kept.any(), "at least one token survives"
    assert torch.equal(out[kept], logits[kept]), "kept logits are unchanged"
    assert (out[~kept] == NEG_INF).all(), "removed tokens are -inf"
    if name in KEEP_ARGMAX:
        assert kept[logits == logits.max()].all(), "the argmax survives"


@SETTINGS
@given(row=logit_lists, q=fractions, name=st.sampled_from(sorted(TRUNCATIONS)), seed=st.integers(0, 1000))
def test_truncation_is_permutation_equivariant(row: list[float], q: float, name: str, seed: int) -> None:
    """Ties are resolved by value, never by position: permuting tokens permutes the result.
    Nucleus truncation compares a float32 cumulative mass with p: where a prefix of the sorted
    mass lies within float32 rounding of the cut (p − 1e-6), the order in which softmax sums the
    row decides the side, so those rows are out of this property's reach."""
    logits = torch.tensor(row)
    if name == "top_p":
        cumulative = torch.softmax(logits.double(), -1).sort(descending=True).values.cumsum(0)
        assume(bool(((cumulative - (q - 1e-6)).abs() > 1e-5).all()))
    permutation = torch.randperm(len(row), generator=torch.Generator().manual_seed(seed))
    out = TRUNCATIONS[name](logits, q)
    assert torch.equal(TRUNCATIONS[name](logits[permutation], q), out[permutation])


@SETTINGS
@given(row=logit_lists, p=fractions)
def test_top_p_is_the_smallest_nucleus(row: list[float], p: float) -> None:
    logits = torch.tensor(row)
    probs = torch.softmax(logits, -1).double()  # float32 softmax, as the library
    kept = torch.isfinite(top_p(logits, p))
    assert probs[kept].sum() >= p - 1e-5, "the nucleus reaches p"
    # Without the tokens tied at the cutoff the mass is below p: the set is minimal up to ties.
    cutoff = probs[kept].min()
    assert probs[kept & (probs > cutoff)].sum() < p + 1e-5
    # Everything more likely than a kept token is kept.
    assert (probs[~kept] <= cutoff + 1e-12).all()


@SETTINGS
@given(row=logit_lists, mass=fractions)
def test_typical_reaches_its_mass(row: list[float], mass: float) -> None:
    logits = torch.tensor(row)
    probs = torch.softmax(logits, -1).double()  # float32 softmax, as the library
    kept = torch.isfinite(typical(logits, mass))
    assert probs[kept].sum() >= mass - 1e-5


@SETTINGS
@given(row=logit_lists, q=fractions)
def test_thresholds_split_by_probability(row: list[float], q: float) -> None:
    """min_p, epsilon and eta keep exactly the tokens above their threshold (plus the argmax)."""
    logits = torch.tensor(row)
    probs = torch.softmax(logits, -1).double()  # float32 softmax, as the library
    entropy = torch.special.entr(probs).sum()
    thresholds = {
        "min_p": q * probs.max(),
        "epsilon": torch.tensor(q, dtype=torch.float64),
        "eta": torch.minimum(torch.tensor(q, dtype=torch.float64), math.sqrt(q) * torch.exp(-entropy)),
    }
    for name, threshold in thresholds.items():
        kept = torch.isfinite(TRUNCATIONS[name](logits, q))
        is_top = logits == logits.max()
        assert (probs[kept & ~is_top] >= threshold * (1 - 1e-4)).all(), name
        assert (probs[~kept] < threshold * (1 + 1e-4)).all(), name


@SETTINGS
@given(row=logit_lists, k=st.integers(1, 14))
def test_top_k_counts(row: list[float], k: int) -> None:
    logits = torch.tensor(row)
    kept = torch.isfinite(top_k(logits, k))
    finite = int(torch.isfinite(logits).sum())
    assert int(kept.sum()) >= min(k, finite)
    if kept.sum() > k:  # only ties at the k-th value may push the count above k
        assert (logits[kept] == logits[kept].min()).sum() > 1
    if (~kept).any() and kept.any():
        assert logits[kept].min() > logits[~kept].max()
