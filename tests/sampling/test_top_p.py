from __future__ import annotations

import pytest
import torch

from metagen.sampling import top_p

from .helpers import assert_samples_match, logits_of, probs_of, renormalised

PROBS = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    ("p", "kept"),
    [
        (0.7, [2, 3]),  # 0.4 + 0.3 = 0.7 exactly: the boundary is reached, 0.2 is not added
        (0.69, [2, 3]),
        (0.71, [1, 2, 3]),
        (0.4, [3]),  # the top token alone reaches 0.4
        (0.39, [3]),
        (0.41, [2, 3]),
        (0.9, [1, 2, 3]),
        (0.95, [0, 1, 2, 3]),
        (1e-9, [3]),  # always at least one token
    ],
)
def test_nucleus_by_hand(p: float, kept: list[int]) -> None:
    out = top_p(logits_of(PROBS), p)
    assert probs_of(out).tolist() == pytest.approx(renormalised(PROBS, kept), abs=1e-6)


def test_llama_cpp_example() -> None:
    # {0.1, 0.2, 0.3, 0.4} with top_p 0.7 keeps {0.4, 0.3} renormalised to {4/7, 3/7}.
    out = probs_of(top_p(logits_of(PROBS), 0.7))
    assert out[3].item() == pytest.approx(4 / 7, abs=1e-6)
    assert out[2].item() == pytest.approx(3 / 7, abs=1e-6)


def test_p_one_keeps_all() -> None:
    logits = logits_of(PROBS)
    assert torch.equal(top_p(logits, 1.0), logits)


def test_ties_at_the_boundary_are_all_kept() -> None:
    # Uniform over 4 tokens with p = 0.5: the nucleus ends on a tie, so all four are kept.
    out = top_p(torch.zeros(4), 0.5)
    assert torch.isfinite(out).all()
    # {0.4, 0.3, 0.15, 0.15} with p = 0.8: the 0.15 that completes the nucleus is tied with the
    # other 0.15, and both stay.
    out = top_p(logits_of([0.15, 0.4, 0.15, 0.3]), 0.8)
    assert torch.isfinite(out).all()
    out = top_p(logits_of([0.15, 0.4, 0.15, 0.3]), 0.7)
    assert torch.isfinite(out).tolist() == [False, True, False, True]


def test_one_finite_logit() -> None:
    logits = torch.tensor([float("-inf"), 0.3, float("-inf")])
    assert torch.equal(top_p(logits, 0.5), logits)


def test_batched_and_3d() -> None:
    logits = torch.stack([logits_of(PROBS), logits_of(PROBS[::-1])])  # (2, 4)
    out = top_p(logits, 0.7)
    assert torch.isfinite(out).tolist() == [[False, False, True, True], [True, True, False, False]]
    out3 = top_p(logits.unsqueeze(1).expand(2, 3, 4), 0.7)  # (2, 3, 4)
    assert torch.equal(out3, out.unsqueeze(1).expand(2, 3, 4))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_rejects_bad_p(bad: float) -> None:
    with pytest.raises(ValueError, match=r"p=.* is out of range: must be in \(0, 1\]"):
        top_p(torch.zeros(3), bad)


def test_sampled_frequencies() -> None:
    assert_samples_match(top_p(logits_of(PROBS), 0.7), [0, 0, 3 / 7, 4 / 7])
    probs = [0.02, 0.08, 0.1, 0.15, 0.25, 0.4]
    assert_samples_match(top_p(logits_of(probs), 0.85), renormalised(probs, [2, 3, 4, 5]), seed=1)


@pytest.mark.parametrize("scale", [0.5, 2.0, 8.0])
def test_partial_sort_cascade_equals_full_sort(scale):
    """Rows whose nucleus lies in the top 256, the top 4096 or needs the whole row agree with
    the definition computed by one full sort."""
    generator = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(6, 20000, generator=generator) * scale
    for p in (0.5, 0.9, 0.99):
        probs = torch.softmax(logits, dim=-1).double()
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        before = sorted_probs.cumsum(-1) - sorted_probs
        size = (before < p - 1e-6).sum(-1, keepdim=True).clamp(min=1)
        expected = probs >= sorted_probs.gather(-1, size - 1)
        assert torch.equal(torch.isfinite(top_p(logits, p)), expected)


@pytest.mark.parametrize("scale", [0.5, 2.0, 8.0])
def test_quickselect_kernel_and_partial_sort_agree(scale, monkeypatch):
    """The compiled quickselect cutoff and the PyTorch partial-sort path keep the same tokens,
    including rows with ties at the cutoff."""
    import sys

    module = sys.modules["metagen.sampling.top_p"]  # the package exports the function as `top_p`

    if module.fused_kernels() is None:
        pytest.skip("compiled kernels unavailable")
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(8, 5000, generator=generator) * scale
    logits[0, :10] = 3.0  # a block of ties at the top
    logits[1] = torch.round(logits[1])  # many ties everywhere
    for p in (0.3, 0.9, 0.999, 1.0 - 1e-7):
        with_kernel = top_p(logits, p)
        monkeypatch.setattr(module, "fused_kernels", lambda: None)
        without = top_p(logits, p)
        monkeypatch.undo()
        assert torch.equal(torch.isfinite(with_kernel), torch.isfinite(without)), p
