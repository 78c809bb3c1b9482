"""Mirostat 2.0 on probabilities {0.5, 0.25, 0.125, 0.125}: surprises 1, 2, 3, 3 bits."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import Mirostat, mirostat_truncate, mirostat_update

from .helpers import DRAWS, assert_frequencies, logits_of, probs_of

PROBS = [0.5, 0.25, 0.125, 0.125]


@pytest.mark.parametrize(
    ("mu", "expected"),
    [
        (2.5, [2 / 3, 1 / 3, 0, 0]),  # keeps surprise <= 2.5: {0.5, 0.25}
        (2.0, [2 / 3, 1 / 3, 0, 0]),  # boundary kept
        (3.0, PROBS),
        (0.5, [1, 0, 0, 0]),  # nothing within mu: the top token is kept anyway
        (-4.0, [1, 0, 0, 0]),
    ],
)
def test_truncation_by_hand(mu: float, expected: list[float]) -> None:
    out = mirostat_truncate(logits_of(PROBS).unsqueeze(0), torch.tensor([mu]))
    assert probs_of(out)[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_truncation_uses_each_rows_mu() -> None:
    logits = logits_of(PROBS).expand(2, 4)
    out = mirostat_truncate(logits, torch.tensor([1.0, 3.0]))
    assert torch.isfinite(out).tolist() == [[True, False, False, False], [True] * 4]


def test_update_by_hand() -> None:
    # Token 1 has surprise 2 bits: mu = 2.5 - 0.1 * (2 - 1.5) = 2.45; token 0: 2.5 - 0.1 * (1 - 1.5).
    log_probs = torch.log_softmax(logits_of(PROBS), -1).expand(3, 4)
    mu = mirostat_update(torch.tensor([2.5, 2.5, 2.5]), log_probs, torch.tensor([1, 0, -1]), 1.5, 0.1)
    assert mu.tolist() == pytest.approx([2.45, 2.55, 2.5])  # -1: finished row, unchanged


def test_initial_mu_is_twice_tau() -> None:
    assert Mirostat.create(3, tau=2.5).mu.tolist() == [5.0, 5.0, 5.0]


def test_one_step_distribution_and_update() -> None:
    """DRAWS rows with mu = 2.5: tokens follow {2/3, 1/3}; each row's mu moves by its surprise."""
    sampler = Mirostat(tau=1.5, learning_rate=0.1, mu=torch.full((DRAWS,), 2.5))
    logits = logits_of(PROBS).expand(DRAWS, 4)
    tokens = sampler.sample(logits, torch.Generator().manual_seed(0))
    assert_frequencies(tokens, [2 / 3, 1 / 3, 0, 0])
    surprise = torch.tensor([1.0, 2.0, 3.0, 3.0])[tokens]
    assert torch.allclose(sampler.mu, 2.5 - 0.1 * (surprise - 1.5))


@pytest.mark.parametrize("tau", [3.0, 5.0])
def test_controls_average_surprise(tau: float) -> None:
    """On a Zipf distribution the observed surprise settles at tau (the algorithm's purpose)."""
    ranks = torch.arange(1, 201, dtype=torch.float64)
    logits = (-1.1 * ranks.log()).float().expand(128, 200).contiguous()
    log2_probs = torch.log_softmax(logits, -1) / math.log(2)
    sampler = Mirostat.create(128, tau, learning_rate=0.1)
    generator = torch.Generator().manual_seed(0)
    surprises = []
    for step in range(150):
        tokens = sampler.sample(logits, generator)
        if step >= 50:
            surprises.append(-log2_probs.gather(1, tokens[:, None]).mean().item())
    assert sum(surprises) / len(surprises) == pytest.approx(tau, abs=0.1)


def test_select_and_fork() -> None:
    sampler = Mirostat(tau=3.0, learning_rate=0.1, mu=torch.tensor([1.0, 2.0, 3.0]))
    forked = sampler.fork(torch.tensor([2]))
    sampler.select(torch.tensor([2, 0, 0]))
    assert sampler.mu.tolist() == [3.0, 1.0, 1.0] and sampler.batch_size == 3
    forked.mu += 1
    assert forked.mu.tolist() == [4.0] and sampler.mu.tolist() == [3.0, 1.0, 1.0]


def test_update_needs_process() -> None:
    with pytest.raises(RuntimeError, match="process"):
        Mirostat.create(1, 3.0).accept(torch.tensor([0]))


@pytest.mark.parametrize(("tau", "rate"), [(0.0, 0.1), (-1.0, 0.1), (3.0, 0.0), (3.0, 1.5)])
def test_rejects_bad_settings(tau: float, rate: float) -> None:
    with pytest.raises(ValueError):
        Mirostat.create(1, tau, rate)
