"""DExperts / proxy tuning on the several-model step (`RowBatch(combiner=)`), against hand computations.

The base is the enumerable toy chain; the expert and the anti-expert are the same chain with
transformed logits (`toy_companions.TransformedToy`). The expected scores are written out here
in float64 from the three models' distributions, without `DExpertsConfig.combine`.
"""

from __future__ import annotations

import math

import pytest
import torch

import metagen.decoding.memory as memory
from metagen.decoding import DExpertsConfig, LogitsCombiner, generate
from metagen.sampling import SamplingParams
from tests.decoding.test_combine import ExpertWithBytes, greedy_by_hand
from tests.decoding.toy_companions import TransformedToy
from tests.decoding.toy_model import BOS, ToyModel, next_logits
from tests.sampling.helpers import DRAWS, assert_frequencies


def expert() -> TransformedToy:
    return TransformedToy("toy-expert", 1.5, [0.0, -0.4, 0.9, 0.3, 0.0])


def anti_expert() -> TransformedToy:
    return TransformedToy("toy-anti", 0.5, [0.0, 0.6, -0.3, 0.2, 0.0], base_flops=20.0)


def expected_scores(context: list[int], alpha: float) -> torch.Tensor:
    """log p_base + α (log p_expert − log p_anti) after `context`: (V,) float64."""
    base = torch.log_softmax(next_logits(context).double(), dim=-1)
    good = torch.log_softmax(expert().logits_after(context), dim=-1)
    bad = torch.log_softmax(anti_expert().logits_after(context), dim=-1)
    return base + alpha * (good - bad)


def test_combine_gives_the_formula_on_toy_logits_by_hand():
    # base p = (1/2, 1/4, 1/4); expert p = (1/4, 1/2, 1/4); anti p = (1/4, 1/4, 1/2); α = 2
    logs = [torch.tensor([[math.log(p) for p in probs]]) for probs in
            ((0.5, 0.25, 0.25), (0.25, 0.5, 0.25), (0.25, 0.25, 0.5))]
    scores = DExpertsConfig(expert=None, anti_expert=None, alpha=2.0).combine(logs)
    ln2 = math.log(2.0)
    # log(1/2) + 2·0, log(1/4) + 2·ln 2, log(1/4) − 2·ln 2
    assert scores[0].tolist() == pytest.approx([-ln2, -2 * ln2 + 2 * ln2, -2 * ln2 - 2 * ln2], abs=1e-6)
    # p ∝ p_base (p_expert / p_anti)^α: (1/2, 1, 1/16) normalised
    assert torch.softmax(scores, -1)[0].tolist() == pytest.approx([8 / 25, 16 / 25, 1 / 25], abs=1e-6)
    assert torch.equal(logs[0], torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)]]))  # inputs untouched


def test_dexperts_config_is_a_combiner_and_checks_alpha_by_name():
    config = DExpertsConfig(expert(), anti_expert(), alpha=0.5)
    assert isinstance(config, LogitsCombiner)
    assert [m.name for m in config.companions] == ["toy-expert", "toy-anti"]
    for alpha in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"alpha=.* is out of range: must be a finite number >= 0"):
            DExpertsConfig(expert(), anti_expert(), alpha=alpha)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
def test_greedy_takes_the_argmax_of_the_combined_score_at_every_step(alpha):
    combiner = DExpertsConfig(expert(), anti_expert(), alpha=alpha)
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6), combiner=combiner)
    expected = greedy_by_hand(lambda context: expected_scores(context, alpha))
    assert result.completions[0].token_ids == expected
    plain = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6)).completions[0].token_ids
    if alpha == 3.0:
        assert expected != plain  # the steering changes the choice


def test_sampled_first_token_follows_softmax_of_the_scores_over_temperature():
    temperature = 0.8
    params = SamplingParams(temperature=temperature, max_tokens=1, n=DRAWS, seed=5)
    result = generate(ToyModel(), [BOS], params, combiner=DExpertsConfig(expert(), anti_expert(), alpha=1.5))
    tokens = torch.tensor([c.token_ids[0] for c in result.completions])
    assert_frequencies(tokens, torch.softmax(expected_scores([BOS], 1.5) / temperature, dim=-1))


def test_cost_counts_three_models_calls_and_flops():
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, n=2),
                      combiner=DExpertsConfig(expert(), anti_expert()))
    cost = result.cost
    # prefill: base 101, expert 11, anti 21; two decode forwards of 2 rows at positions 1 and 2, each model
    assert cost.flops == (101 + 2 * 102 + 2 * 103) + (11 + 2 * 12 + 2 * 13) + (21 + 2 * 22 + 2 * 23)
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (9, 6, 6)


def test_memory_check_counts_three_models_cache_bytes(monkeypatch):
    base = ExpertWithBytes(1000)
    good = TransformedToy("toy-expert", 1.0, [0.0] * 5, kv_bytes=2000)
    bad = TransformedToy("toy-anti", 1.0, [0.0] * 5, kv_bytes=3000)
    # per row of 10 new tokens: base alone 6·5·4 + 10·1000 = 10,120 bytes; with both companions
    # (6 + 2 + 2)·5·4 + 10·(1000 + 2000 + 3000) = 60,200 bytes
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 60_200)
    params = SamplingParams(temperature=0, max_tokens=10, n=2)
    generate(base, [BOS], params, combiner=DExpertsConfig(good, bad))  # exactly fits
    with pytest.raises(ValueError, match=r"n=3 is too large.*models 'toy', 'toy-expert' and 'toy-anti'"):
        generate(base, [BOS], SamplingParams(temperature=0, max_tokens=10, n=3), combiner=DExpertsConfig(good, bad))


def test_the_base_as_its_own_expert_reuses_its_logits_and_is_counted_once(monkeypatch):
    """DExperts(expert=model, anti): the expert's logits are the model's own (no second forward,
    cache or memory check), so the output equals that of a separate copy of the model as the expert
    while the Cost counts two models, not three."""
    base, copy = ToyModel(), ToyModel()
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, n=2)
    calls = []
    forward = base.forward
    monkeypatch.setattr(base, "forward", lambda cache, tokens, **kw: calls.append(1) or forward(cache, tokens, **kw))
    shared = generate(base, [BOS], params, combiner=DExpertsConfig(base, anti_expert(), alpha=2.0))
    separate = generate(ToyModel(), [BOS], params, combiner=DExpertsConfig(copy, anti_expert(), alpha=2.0))
    assert [c.token_ids for c in shared.completions] == [c.token_ids for c in separate.completions]
    assert len(calls) == 5  # the prefill and four decode forwards, once each
    # the toy's FLOPs are 100 + context per token: prefill 101, four decode forwards of 2 rows
    base_flops = 101 + sum(2 * (101 + position) for position in range(1, 5))
    anti_flops = 21 + sum(2 * (21 + position) for position in range(1, 5))
    assert shared.cost.flops == base_flops + anti_flops
    assert separate.cost.flops == 2 * base_flops + anti_flops
    assert (shared.cost.model_calls, separate.cost.model_calls) == (10, 15)


def test_the_memory_check_counts_a_shared_expert_once(monkeypatch):
    base = ExpertWithBytes(1000)
    bad = TransformedToy("toy-anti", 1.0, [0.0] * 5, kv_bytes=3000)
    # per row of 10 new tokens: (6 + 2)·5·4 + 10·(1000 + 3000) = 40,160 bytes; a second copy of the
    # base would need 10,000 more
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 40_160)
    generate(base, [BOS], SamplingParams(temperature=0, max_tokens=10, n=2), combiner=DExpertsConfig(base, bad))
    with pytest.raises(ValueError, match=r"n=3 is too large.*models 'toy' and 'toy-anti'"):
        generate(base, [BOS], SamplingParams(temperature=0, max_tokens=10, n=3), combiner=DExpertsConfig(base, bad))
