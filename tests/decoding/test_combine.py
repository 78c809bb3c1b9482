"""Contrastive decoding on the several-model step (`RowBatch(combiner=)`), against hand computations.

The expert is the enumerable toy model; the amateur (`AmateurToy`) is the same chain made flatter
and biased, z_ama = z_exp / 2 + BIAS, over the same five tokens. The expected contrastive scores
are computed here in float64 from the two models' distributions, written out without
`sampling.contrastive`.
"""

from __future__ import annotations

import math

import pytest
import torch

import metagen.decoding.memory as memory
from metagen.decoding import BeamSearchConfig, ContrastiveConfig, beam_search, generate
from metagen.decoding.combine import LogitsCombiner, check_same_vocabulary
from metagen.decoding.memory import check_batch_fits
from metagen.sampling import SamplingParams
from tests.decoding.toy_model import BOS, EOS, VOCAB, ToyModel, ToyTokenizer, next_logits
from tests.sampling.helpers import DRAWS, assert_frequencies

BIAS = torch.tensor([0.0, 0.6, -0.3, 0.2, 0.0])


class AmateurToy(ToyModel):
    """The toy chain with logits z / 2 + BIAS, its own (made-up) FLOPs and cache bytes."""

    name = "toy-amateur"

    def __init__(self, kv_bytes: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self._kv_bytes = kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    def flops_per_token(self, context_length: int) -> float:
        return 10.0 + context_length

    def forward(self, cache, tokens, *, logits="last", hidden=False):
        out = super().forward(cache, tokens, logits=logits, hidden=hidden)
        if out.logits is not None:
            out.logits = out.logits / 2 + BIAS
        return out


class ExpertWithBytes(ToyModel):
    def __init__(self, kv_bytes: int) -> None:
        super().__init__()
        self._kv_bytes = kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes


def expected_scores(context: list[int], alpha: float, amateur_temperature: float = 1.0) -> torch.Tensor:
    """log p_exp − log p_ama (amateur at τ) where p_exp ≥ α · max p_exp, −inf elsewhere: (V,) float64."""
    expert = torch.log_softmax(next_logits(context).double(), dim=-1)
    amateur = torch.log_softmax((next_logits(context).double() / 2 + BIAS.double()) / amateur_temperature, dim=-1)
    plausible = expert.exp() >= alpha * expert.exp().max()
    return torch.where(plausible, expert - amateur, torch.tensor(-math.inf, dtype=torch.float64))


def expected_beta_scores(context: list[int], alpha: float, beta: float, amateur_temperature: float = 1.0):
    """(1 + β) z_exp − β z_ama / τ on the logits where p_exp ≥ α · max p_exp, −inf elsewhere
    (O'Brien & Lewis 2023): (V,) float64."""
    expert = next_logits(context).double()
    amateur = (expert / 2 + BIAS.double()) / amateur_temperature
    probs = torch.softmax(expert, dim=-1)
    plausible = probs >= alpha * probs.max()
    return torch.where(plausible, (1 + beta) * expert - beta * amateur, torch.tensor(-math.inf, dtype=torch.float64))


def test_contrastive_config_is_a_combiner_and_checks_its_fields():
    assert isinstance(ContrastiveConfig(amateur=AmateurToy()), LogitsCombiner)
    with pytest.raises(ValueError, match=r"alpha=1.5 is out of range"):
        ContrastiveConfig(amateur=AmateurToy(), alpha=1.5)
    with pytest.raises(ValueError, match=r"amateur_temperature=0.0 is out of range"):
        ContrastiveConfig(amateur=AmateurToy(), amateur_temperature=0.0)
    with pytest.raises(ValueError, match=r"beta=-0.5 is out of range: must be None or a finite number >= 0"):
        ContrastiveConfig(amateur=AmateurToy(), beta=-0.5)
    with pytest.raises(ValueError, match=r"beta=inf is out of range"):
        ContrastiveConfig(amateur=AmateurToy(), beta=float("inf"))


@pytest.mark.parametrize(("alpha", "amateur_temperature"), [(0.1, 1.0), (0.3, 0.5), (0.0, 2.0)])
def test_greedy_takes_the_argmax_of_the_contrastive_score_at_every_step(alpha, amateur_temperature):
    combiner = ContrastiveConfig(AmateurToy(), alpha=alpha, amateur_temperature=amateur_temperature)
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6), combiner=combiner)
    expected = greedy_by_hand(lambda context: expected_scores(context, alpha, amateur_temperature))
    assert result.completions[0].token_ids == expected
    plain = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6)).completions[0].token_ids
    assert expected != plain  # the contrast changes the choice: greedy on the expert alone is "a a b"


def greedy_by_hand(scores_of, steps: int = 6) -> list[int]:
    """The greedy path from [BOS] of `scores_of(context)` (V,), computed step by step, ending at EOS."""
    context, expected = [BOS], []
    while len(expected) < steps:
        token = int(scores_of(context).argmax())
        expected.append(token)
        context.append(token)
        if token == EOS:
            break
    return expected


# On this toy a small β keeps the expert's own greedy path "a a b" (its logits dominate), where
# Li et al.'s score takes "b"; a larger β, or a hotter amateur, moves to "b" too.
@pytest.mark.parametrize(("alpha", "beta", "amateur_temperature"),
                         [(0.1, 0.3, 1.0), (0.1, 1.0, 1.0), (0.0, 1.0, 2.0), (0.3, 0.2, 0.5)])
def test_greedy_with_beta_takes_the_argmax_of_the_beta_score_at_every_step(alpha, beta, amateur_temperature):
    combiner = ContrastiveConfig(AmateurToy(), alpha=alpha, amateur_temperature=amateur_temperature, beta=beta)
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6), combiner=combiner)
    expected = greedy_by_hand(lambda context: expected_beta_scores(context, alpha, beta, amateur_temperature))
    assert result.completions[0].token_ids == expected
    plain = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=6)).completions[0].token_ids
    li = greedy_by_hand(lambda context: expected_scores(context, alpha, amateur_temperature))
    assert expected != plain or expected != li  # the case tells β's score from the other two


def test_the_beta_combiner_scores_are_the_hand_computed_ones():
    combiner = ContrastiveConfig(AmateurToy(), alpha=0.1, amateur_temperature=0.5, beta=0.5)
    contexts = [[BOS], [BOS, 1], [BOS, 1, 1], [BOS, 2]]
    expert = torch.stack([next_logits(context) for context in contexts])  # (4, V)
    scores = combiner.combine([expert, expert / 2 + BIAS])
    expected = torch.stack([expected_beta_scores(context, 0.1, 0.5, 0.5) for context in contexts]).float()
    assert torch.equal(torch.isinf(scores), torch.isinf(expected)) and torch.isinf(expected).any()
    assert torch.allclose(scores, expected, atol=1e-5)


def test_greedy_with_beta_zero_is_the_expert_alone_and_a_large_beta_changes_the_choice():
    params = SamplingParams(temperature=0, max_tokens=6)
    plain = generate(ToyModel(), [BOS], params).completions[0].token_ids
    zero = generate(ToyModel(), [BOS], params, combiner=ContrastiveConfig(AmateurToy(), beta=0.0))
    assert zero.completions[0].token_ids == plain
    strong = generate(ToyModel(), [BOS], params, combiner=ContrastiveConfig(AmateurToy(), beta=3.0))
    assert strong.completions[0].token_ids != plain


def test_sampled_first_token_follows_softmax_of_contrastive_scores_over_temperature():
    temperature = 0.7
    params = SamplingParams(temperature=temperature, max_tokens=1, n=DRAWS, seed=11)
    result = generate(ToyModel(), [BOS], params, combiner=ContrastiveConfig(AmateurToy(), alpha=0.1))
    tokens = torch.tensor([c.token_ids[0] for c in result.completions])
    expected = torch.softmax(expected_scores([BOS], 0.1) / temperature, dim=-1)
    assert (expected == 0).any()  # the plausibility set removes a token
    assert_frequencies(tokens, expected)


def test_cost_counts_both_models_calls_and_flops():
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, n=2),
                      combiner=ContrastiveConfig(AmateurToy()))
    cost = result.cost
    # prefill: expert 101, amateur 11; two decode forwards of 2 rows at positions 1 and 2, each model
    assert cost.flops == (101 + 2 * 102 + 2 * 103) + (11 + 2 * 12 + 2 * 13)
    # 3 forwards of each model; target steps are the expert's (one per row and forward)
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (6, 6, 6)
    assert (cost.prompt_tokens_computed, cost.prompt_tokens_reused) == (2, 2)


def test_memory_check_counts_both_models_cache_bytes(monkeypatch):
    expert, amateur = ExpertWithBytes(1000), AmateurToy(kv_bytes=3000)
    # per row of 10 new tokens: expert alone 6·5·4 + 10·1000 = 10,120 bytes; with the amateur
    # (6 + 2)·5·4 + 10·(1000 + 3000) = 40,160 bytes
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * 40_160)
    check_batch_fits([expert, amateur], 2, 10)  # exactly fits
    with pytest.raises(ValueError, match=r"models 'toy' and 'toy-amateur'"):
        check_batch_fits([expert, amateur], 3, 10)
    monkeypatch.setattr(memory, "available_memory", lambda: 50_000)
    params = SamplingParams(temperature=0, max_tokens=10, n=2)
    generate(expert, [BOS], params)  # 20,240 bytes: fits alone
    with pytest.raises(ValueError, match=r"n=2 is too large.*models 'toy' and 'toy-amateur'"):
        generate(expert, [BOS], params, combiner=ContrastiveConfig(amateur))


class ShuffledTokenizer(ToyTokenizer):
    """The toy's five tokens with "a" and "b" swapped: same size, another token → id mapping."""

    def decode(self, ids, skip_special_tokens=False):
        return super().decode([{1: 2, 2: 1}.get(i, i) for i in ids], skip_special_tokens)


class BiggerVocabulary(AmateurToy):
    @property
    def vocab_size(self) -> int:
        return VOCAB + 1


def test_a_companion_with_another_vocabulary_is_refused_naming_both_models():
    shuffled = AmateurToy()
    shuffled.tokenizer = ShuffledTokenizer()
    with pytest.raises(ValueError, match=r"'toy-amateur' maps tokens to ids differently from model 'toy'"):
        generate(ToyModel(), [BOS], SamplingParams(max_tokens=2), combiner=ContrastiveConfig(shuffled))
    with pytest.raises(ValueError, match=r"'toy-amateur' has vocab_size=6, model 'toy' has 5"):
        check_same_vocabulary(ToyModel(), BiggerVocabulary())
    check_same_vocabulary(ToyModel(), AmateurToy())  # another tokenizer object, the same mapping


def _row_alone(tokens: list[int], alpha: float, temperature: float) -> list[float]:
    """log softmax(contrastive / temperature)[token] at each step of one row decoded alone."""
    context, values = [BOS], []
    for token in tokens:
        values.append(float(torch.log_softmax(expected_scores(context, alpha) / temperature, dim=-1)[token]))
        context.append(token)
    return values


def test_rows_finishing_at_different_times_keep_expert_and_amateur_caches_aligned():
    params = SamplingParams(temperature=1.3, max_tokens=7, n=4, seed=3)
    model, amateur = ToyModel(), AmateurToy()
    result = generate(model, [BOS], params, combiner=ContrastiveConfig(amateur, alpha=0.05))
    lengths = [len(c.token_ids) for c in result.completions]
    assert len(set(lengths)) > 1, lengths  # rows left the batch at different steps
    # each forward after the prefill ran as many rows in both models (the batch shrank in both)
    assert [len(call) for call in model.calls] == [len(call) for call in amateur.calls]
    for completion in result.completions:
        # the sampling log-probs are those of each row decoded alone, so each row's amateur
        # logits came from its own history
        assert completion.sampling_logprobs == pytest.approx(_row_alone(completion.token_ids, 0.05, 1.3), abs=1e-5)


def test_beam_search_of_width_one_over_contrastive_scores_is_greedy_contrastive_decoding():
    combiner = ContrastiveConfig(AmateurToy(), alpha=0.1)
    greedy = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=5), combiner=combiner)
    beam = beam_search(ToyModel(), [BOS], BeamSearchConfig(width=1, max_tokens=5), combiner=combiner)
    hypothesis = beam.completions[0]
    assert hypothesis.token_ids == greedy.completions[0].token_ids
    # the score a beam accumulates is the contrastive score (length penalty 1: its mean)
    context, total = [BOS], 0.0
    for token in hypothesis.token_ids:
        total += float(expected_scores(context, 0.1)[token])
        context.append(token)
    assert hypothesis.score == pytest.approx(total / len(hypothesis.token_ids), abs=1e-5)
    # both models per forward; the expert's one target step per live beam and forward. Contrastive
    # scores can be positive, so the search has no early stop: it ran to max_tokens
    assert beam.cost.model_calls == 2 * beam.cost.target_steps == 2 * 5


def test_beam_search_with_a_combiner_keeps_the_best_contrastive_sequence():
    combiner = ContrastiveConfig(AmateurToy(), alpha=0.1)
    config = BeamSearchConfig(width=3, max_tokens=3, length_penalty=0.0, n_best=3)
    result = beam_search(ToyModel(), [BOS], config, combiner=combiner)
    scores = [h.score for h in result.completions]
    assert scores == sorted(scores, reverse=True)
    for hypothesis in result.completions:  # each score is its sequence's summed contrastive score
        context, total = [BOS], 0.0
        for token in hypothesis.token_ids:
            total += float(expected_scores(context, 0.1)[token])
            context.append(token)
        assert hypothesis.score == pytest.approx(total, abs=1e-5)


def test_local_generator_with_a_combiner_decodes_contrastively_and_withholds_the_model_alone():
    from metagen.decoding import LocalGenerator
    from metagen.decoding import capabilities as caps

    combiner = ContrastiveConfig(AmateurToy(), alpha=0.1)
    params = SamplingParams(temperature=0, max_tokens=5)
    local = LocalGenerator(ToyModel(), combiner=combiner)
    assert local.generate([BOS], params).completions[0].token_ids == \
        generate(ToyModel(), [BOS], params, combiner=combiner).completions[0].token_ids
    with pytest.raises(ValueError, match="local_cache"):
        local.local_model()
    assert caps.LOCAL_CACHE in LocalGenerator(ToyModel()).capabilities  # the class's own set is untouched
    # the companions keep no prompt between calls: neither does the model, so each call costs a first one's
    assert not local.keeps_prompt and LocalGenerator(ToyModel()).keeps_prompt
    provided = LocalGenerator.provides(combiner=ContrastiveConfig(None))  # what a command checks before loading
    assert provided.capabilities == local.capabilities and provided.described_as == local.described_as
    assert local.decoder is combiner and LocalGenerator(ToyModel()).decoder is None


def _implausible_tokens(completions, alpha: float) -> int:
    """How many tokens of `completions` lie outside their step's α-plausible set."""
    count = 0
    for completion in completions:
        context = [BOS]
        for token in completion.token_ids:
            count += not math.isfinite(float(expected_scores(context, alpha)[token]))
            context.append(token)
    return count


def test_stochastic_beam_search_with_a_combiner_takes_plausible_tokens_only():
    config = BeamSearchConfig(width=3, max_tokens=4, n_best=3, stochastic=True)
    combiner = ContrastiveConfig(AmateurToy(), alpha=0.3)
    with_combiner, without = [], []
    for seed in range(20):
        result = beam_search(ToyModel(), [BOS], config, combiner=combiner, generator=torch.Generator().manual_seed(seed))
        with_combiner += result.completions
        without += beam_search(ToyModel(), [BOS], config, generator=torch.Generator().manual_seed(seed)).completions
    assert _implausible_tokens(with_combiner, 0.3) == 0
    assert _implausible_tokens(without, 0.3) > 0  # the model alone does take them
