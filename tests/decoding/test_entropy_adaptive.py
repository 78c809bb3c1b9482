"""Entropy-adaptive decoding on the several-model step (`RowBatch` with a switching combiner).

The small model is the enumerable toy chain; the large one the same chain with biased logits
(`toy_companions.TransformedToy`), so the two choose differently. The switch points are
computed here from the small model's entropies in bits, written out without the library.
"""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding import BeamSearchConfig, EntropyAdaptiveConfig, SwitchingCombiner, beam_search, generate
from metagen.decoding.entropy_adaptive import entropy_bits
from metagen.sampling import SamplingParams
from tests.decoding.toy_companions import TransformedToy
from tests.decoding.toy_model import A, BOS, C, EOS, ToyModel, next_logits


def large() -> TransformedToy:
    return TransformedToy("toy-large", 1.0, [0.0, -1.0, -1.0, 2.0, 0.0])  # leans to "c"


def small_entropy(context: list[int]) -> float:
    """−Σ p log2 p of the small model after `context`, float64."""
    probs = torch.softmax(next_logits(context).double(), dim=-1)
    return float(-(probs * torch.log2(probs)).sum())


def reference(threshold: float, window: int, max_tokens: int) -> tuple[list[int], list[bool]]:
    """Greedy tokens and, per step, whether the large model gave it: the rule by hand."""
    context, tokens, used, entropies = [BOS], [], [], []
    while len(tokens) < max_tokens:
        entropies.append(small_entropy(context))
        recent = entropies[-window:]
        use = sum(recent) / len(recent) > threshold
        logits = large().logits_after(context) if use else next_logits(context).double()
        token = int(logits.argmax())
        tokens.append(token)
        used.append(use)
        context.append(token)
        if token == EOS:
            break
    return tokens, used


def test_config_is_a_switching_combiner_and_checks_its_fields_by_name():
    assert isinstance(EntropyAdaptiveConfig(large(), threshold=1.0), SwitchingCombiner)
    with pytest.raises(ValueError, match=r"threshold=-1.0 is out of range"):
        EntropyAdaptiveConfig(large(), threshold=-1.0)
    with pytest.raises(ValueError, match=r"threshold=inf is out of range"):
        EntropyAdaptiveConfig(large(), threshold=math.inf)
    with pytest.raises(ValueError, match=r"window=0 is out of range: must be an int >= 1"):
        EntropyAdaptiveConfig(large(), threshold=1.0, window=0)


def test_entropy_is_in_bits():
    assert entropy_bits(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -math.inf, -math.inf, -math.inf]])).tolist() == \
        pytest.approx([2.0, 0.0])


def test_switch_points_computed_by_hand():
    # small entropies (bits): after BOS 1.733, after "a" 2.231, after "a a" 2.243, after "a a c" ≈ 0.46.
    # τ = 2, w = 2: the means are 1.733, 1.982 (small: "a", "a"), 2.237 (large: "c"), then ≈ 1.35
    # and lower (small: "c" again)
    assert small_entropy([BOS, A, A]) == pytest.approx(2.2432, abs=1e-3)
    model, big = ToyModel(), large()
    config = EntropyAdaptiveConfig(big, threshold=2.0, window=2)
    result = generate(model, [BOS], SamplingParams(temperature=0, max_tokens=5), combiner=config)
    assert result.completions[0].token_ids == [A, A, C, C, C]
    assert result.completions[0].token_ids == reference(2.0, 2, 5)[0]
    assert result.model_tokens == {"small": 4, "large": 1}
    assert result.model_shares == {"small": 0.8, "large": 0.2}
    # the large model ran once: the prompt, then the two tokens it missed in one forward
    assert big.calls == [[1], [2]]
    cost = result.cost
    # small: prefill 101, forwards at positions 1..4; large: prefill 11, catch-up of 2 at 1, 2
    assert cost.flops == (101 + 102 + 103 + 104 + 105) + (11 + 12 + 13)
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (5 + 2, 5, 5)


@pytest.mark.parametrize(("threshold", "window"), [(0.0, 1), (1.0, 1), (1.5, 3), (2.1, 5), (9.0, 2)])
def test_greedy_follows_the_rule_at_every_step(threshold, window):
    big = large()
    result = generate(ToyModel(), [BOS], SamplingParams(temperature=0, max_tokens=8),
                      combiner=EntropyAdaptiveConfig(big, threshold=threshold, window=window))
    tokens, used = reference(threshold, window, 8)
    assert result.completions[0].token_ids == tokens
    assert result.model_tokens == {"small": used.count(False), "large": used.count(True)}
    if not any(used):
        assert big.calls == [] and result.cost.model_calls == len(tokens)  # the large model never ran
    if threshold == 0.0:  # every token from the large model: its own greedy chain
        assert all(used)


def test_caught_up_logits_equal_a_fresh_prefill_of_the_same_prefix():
    seen = []

    class Recording(TransformedToy):
        def forward(self, cache, tokens, **kwargs):
            out = super().forward(cache, tokens, **kwargs)
            seen.append((out.logits, [list(row) for row in cache.rows]))
            return out

    big = Recording("toy-large", 1.0, [0.0, -1.0, -1.0, 2.0, 0.0])
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=4, ignore_eos=True)
    generate(ToyModel(), [BOS], params, combiner=EntropyAdaptiveConfig(big, threshold=1.0, window=3))
    assert len(seen) >= 3  # the prompt and at least two catch-ups
    for logits, rows in seen:
        for b, prefix in enumerate(rows):
            _, fresh = large().prefill(prefix)
            assert torch.allclose(logits[b], fresh.logits[0])


def test_rows_decide_on_their_own_and_each_token_follows_its_models_distribution():
    # sampled rows take the large model's distribution exactly at the steps their own rolling
    # entropy is above τ (the sampling log-probs say which distribution each token came from)
    params = SamplingParams(temperature=1.0, max_tokens=6, n=6, seed=7)
    result = generate(ToyModel(), [BOS], params, combiner=EntropyAdaptiveConfig(large(), threshold=1.6, window=2))
    counts = {"small": 0, "large": 0}
    modes = set()
    for completion in result.completions:
        context, entropies, row_modes = [BOS], [], []
        for token, logprob in zip(completion.token_ids, completion.sampling_logprobs):
            entropies.append(small_entropy(context))
            use = sum(entropies[-2:]) / len(entropies[-2:]) > 1.6
            logits = large().logits_after(context) if use else next_logits(context).double()
            assert logprob == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)
            counts["large" if use else "small"] += 1
            row_modes.append(use)
            context.append(token)
        modes.add(tuple(row_modes))
    assert result.model_tokens == counts and counts["large"] > 0 and counts["small"] > 0
    assert len(modes) > 1  # the rows did not all switch together
    assert len({len(c.token_ids) for c in result.completions}) > 1  # rows left the batch at different steps


def test_beam_search_refuses_a_switching_combiner_by_name():
    with pytest.raises(ValueError, match=r"EntropyAdaptiveConfig switches models row by row.*--width"):
        beam_search(ToyModel(), [BOS], BeamSearchConfig(width=2, max_tokens=3),
                    combiner=EntropyAdaptiveConfig(large(), threshold=1.0))
