"""O'Brien & Lewis's beta-weighted contrastive scores by hand: (1 + beta) s_exp - beta s_ama on the logits.

Expert logits s_exp = (2, 1, 0, -3), amateur logits s_ama = (1.5, -1, 0.5, 0), alpha 0.1.
Plausible: s_exp - max s_exp >= ln 0.1 = -2.303 -> tokens 0, 1, 2 (token 3 is at -5).
beta 0:   (2, 1, 0, -inf)                                   the expert's logits, masked
beta 0.5: 1.5 s_exp - 0.5 s_ama = (2.25, 2.0, -0.25, -inf)
beta 1:   2 s_exp - s_ama       = (2.5, 3.0, -0.5, -inf)    the contrast moves the argmax to token 1
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import contrastive

EXPERT = torch.tensor([2.0, 1.0, 0.0, -3.0])
AMATEUR = torch.tensor([1.5, -1.0, 0.5, 0.0])
INF = float("inf")


@pytest.mark.parametrize(
    ("beta", "expected"),
    [
        (0.0, [2.0, 1.0, 0.0, -INF]),
        (0.5, [2.25, 2.0, -0.25, -INF]),
        (1.0, [2.5, 3.0, -0.5, -INF]),
    ],
)
def test_scores_by_hand(beta: float, expected: list[float]) -> None:
    assert contrastive(EXPERT, AMATEUR, alpha=0.1, beta=beta).tolist() == expected


def test_beta_zero_is_the_expert_logits_masked_exactly() -> None:
    expert = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    amateur = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    out = contrastive(expert, amateur, alpha=0.2, beta=0.0)
    plausible = torch.softmax(expert, -1) >= 0.2 * torch.softmax(expert, -1).amax(-1, keepdim=True)
    assert torch.equal(out, torch.where(plausible, expert, torch.tensor(-INF)))


def test_amateur_temperature_divides_the_amateur_logits() -> None:
    # beta 1, tau 2: 2 s_exp - s_ama / 2 = (4 - 0.75, 2 + 0.5, 0 - 0.25, -inf).
    out = contrastive(EXPERT, AMATEUR, alpha=0.1, amateur_temperature=2.0, beta=1.0)
    assert out.tolist() == [3.25, 2.5, -0.25, -INF]


def test_as_logits_it_is_expert_log_probs_plus_beta_times_li_et_al() -> None:
    # Shifting either model's logits by a constant shifts the row by a constant: the same softmax,
    # which is softmax(log p_exp + beta (log p_exp - log p_ama)) on the plausible set.
    beta = 0.5
    out = contrastive(EXPERT + 7.0, AMATEUR - 3.0, alpha=0.1, beta=beta)
    li = contrastive(EXPERT, AMATEUR, alpha=0.1)
    expert_log_probs = torch.log_softmax(EXPERT, -1)
    expected = torch.softmax(expert_log_probs + beta * li, -1)
    assert torch.softmax(out, -1).tolist() == pytest.approx(expected.tolist(), abs=1e-6)


def test_infinite_logits_stay_finite_or_masked_and_inputs_are_kept() -> None:
    amateur = torch.tensor([1.5, -INF, 0.5, 0.0])
    before = amateur.clone()
    for beta in (0.0, 1.0):
        out = contrastive(EXPERT, amateur, alpha=0.1, beta=beta)
        assert torch.isfinite(out[:3]).all() and out[3].item() == -INF
    assert contrastive(EXPERT, amateur, alpha=0.1, beta=1.0).argmax().item() == 1
    assert torch.equal(amateur, before)


@pytest.mark.parametrize("beta", [-0.5, INF, math.nan])
def test_beta_out_of_range_is_refused_by_name(beta: float) -> None:
    with pytest.raises(ValueError, match=r"beta=.* is out of range: must be None or a finite number >= 0"):
        contrastive(EXPERT, AMATEUR, beta=beta)
