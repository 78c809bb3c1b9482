"""Mirostat 1.0 (Basu et al. 2021, Algorithm 1): the Zipf fit, k from mu, the truncation, the
sampled distribution (chi-square) and the controller reaching tau."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import Mirostat, SamplerChain, SamplingParams
from metagen.sampling.mirostat import mirostat_v1_truncate, zipf_exponent, zipf_top_k

from .helpers import DRAWS, assert_frequencies, probs_of


def zipf_logits(exponent: float, vocab: int) -> torch.Tensor:
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    return (-exponent * ranks.log()).float()


@pytest.mark.parametrize("exponent", [0.8, 1.1, 1.5, 2.0])
def test_the_fit_recovers_a_zipf_exponent(exponent):
    """On p_i ∝ i^-s every b_i is s·t_i, so the least-squares fit is s exactly."""
    assert zipf_exponent(zipf_logits(exponent, 500)[None]).item() == pytest.approx(exponent, abs=1e-5)


def test_the_fit_reads_the_top_100_whatever_the_order():
    logits = zipf_logits(1.3, 300)
    shuffled = logits[torch.randperm(300, generator=torch.Generator().manual_seed(0))]
    assert zipf_exponent(shuffled[None]).item() == pytest.approx(1.3, abs=1e-5)
    # only the top 100 are read: changing the tail below them changes nothing
    tail_changed = logits.clone()
    tail_changed[150:] = -50.0
    assert zipf_exponent(tail_changed[None]).item() == pytest.approx(1.3, abs=1e-5)


def test_k_by_hand():
    """s = 1.5, mu = 6, V = 1000: k = round((0.5 · 64 / (1 - 1000^-0.5))^(1/1.5)) = round(10.33) = 10."""
    expected = round((0.5 * 2**6 / (1 - 1000 ** -0.5)) ** (1 / 1.5))
    assert expected == 10
    k = zipf_top_k(torch.tensor([1.5], dtype=torch.float64), torch.tensor([6.0]), 1000)
    assert k.tolist() == [10]


def test_k_at_exponent_one_is_the_limit():
    """e = s - 1 -> 0: e·2^mu / (1 - V^-e) -> 2^mu / ln V."""
    at_one = zipf_top_k(torch.tensor([1.0], dtype=torch.float64), torch.tensor([8.0]), 5000).item()
    near = zipf_top_k(torch.tensor([1.0 + 1e-6], dtype=torch.float64), torch.tensor([8.0]), 5000).item()
    assert at_one == near == round(2**8 / math.log(5000))


def test_k_is_clamped_to_the_vocabulary():
    k = zipf_top_k(torch.tensor([1.2, 1.2, 0.0], dtype=torch.float64), torch.tensor([-30.0, 60.0, 3.0]), 50)
    assert k.tolist() == [1, 50, 50]


def test_truncation_keeps_k_tokens_and_renormalises():
    logits = zipf_logits(1.5, 1000)[None]
    out = mirostat_v1_truncate(logits, torch.tensor([6.0]))
    kept = torch.isfinite(out)[0]
    assert kept[:10].all() and not kept[10:].any()
    expected = probs_of(logits)[0, :10] / probs_of(logits)[0, :10].sum()
    assert probs_of(out)[0, :10].tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def test_one_step_draws_from_the_top_k():
    """DRAWS rows at mu = 6 on the Zipf(1.5) vocabulary of 1000: draws follow the renormalised top 10."""
    logits = zipf_logits(1.5, 1000)
    probs = torch.softmax(logits.double(), -1)
    expected = torch.zeros(1000, dtype=torch.float64)
    expected[:10] = probs[:10] / probs[:10].sum()
    sampler = Mirostat(tau=3.0, learning_rate=0.1, mu=torch.full((DRAWS,), 6.0), version=1)
    tokens = sampler.sample(logits.expand(DRAWS, 1000), torch.Generator().manual_seed(0))
    assert_frequencies(tokens, expected)
    surprise = -torch.log2(probs[tokens])  # under the untruncated distribution
    assert torch.allclose(sampler.mu.double(), 6.0 - 0.1 * (surprise - 3.0), atol=1e-5)


@pytest.mark.parametrize("tau", [3.0, 5.0])
def test_controls_average_surprise(tau):
    """The controller settles the observed surprise at tau on a Zipf distribution."""
    logits = zipf_logits(1.1, 2000).expand(128, 2000).contiguous()
    log2_probs = torch.log_softmax(logits, -1) / math.log(2)
    sampler = Mirostat.create(128, tau, learning_rate=0.1, version=1)
    generator = torch.Generator().manual_seed(0)
    surprises = []
    for step in range(200):
        tokens = sampler.sample(logits, generator)
        if step >= 80:
            surprises.append(-log2_probs.gather(1, tokens[:, None]).mean().item())
    assert sum(surprises) / len(surprises) == pytest.approx(tau, abs=0.15)


def test_version_follows_fork_select_and_concat():
    sampler = Mirostat.create(2, 3.0, version=1)
    assert sampler.fork(torch.tensor([1])).version == 1
    assert Mirostat.concat([sampler, sampler]).version == 1


def test_sampling_params_choose_the_version():
    chain = SamplerChain.from_params(SamplingParams(mirostat_tau=4.0, mirostat_mode=1), batch_size=2, vocab_size=100)
    assert chain.mirostat.version == 1
    assert SamplerChain.from_params(SamplingParams(mirostat_tau=4.0), batch_size=1, vocab_size=100).mirostat.version == 2


@pytest.mark.parametrize(("fields", "message"), [
    ({"mirostat_tau": 3.0, "mirostat_mode": 3}, "mirostat_mode=3 is out of range: must be an int in [1, 2]"),
    ({"mirostat_tau": 3.0, "mirostat_mode": 0}, "mirostat_mode=0 is out of range"),
    ({"mirostat_mode": 1}, "mirostat_mode=1 applies with mirostat_tau only"),
    ({"mirostat_tau": 3.0, "mirostat_mode": True}, "is not an int"),
])
def test_bad_modes_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**fields)


def test_bad_version_is_refused():
    with pytest.raises(ValueError, match="version=3 is out of range"):
        Mirostat.create(1, 3.0, version=3)
