"""LocalGenerator: one prefill, n forked rows, and a Cost that adds up."""

import pytest
import torch

from metagen.decoding import Cost, LocalGenerator
from metagen.decoding.cost import forward_flops
from metagen.sampling import SamplingParams


def test_cost_adds_field_by_field():
    a = Cost(model_calls=2, prompt_tokens_computed=10, prompt_tokens_reused=30, generated_tokens=5, flops=1e6, wall_seconds=0.5)
    b = Cost(model_calls=1, generated_tokens=3, flops=2e6)
    total = a + b
    assert total == Cost(3, 10, 30, 8, 3e6, 0.5)
    a += b
    assert a == total
    assert total.prompt_reuse_fraction == pytest.approx(0.75)


@pytest.mark.slow
def test_local_generator_prefills_once_and_counts_flops(model):
    generator = LocalGenerator(model)
    params = SamplingParams(temperature=1.0, max_tokens=6, n=4, seed=3, ignore_eos=True)
    result = generator.generate("Name a colour.", params)
    prompt_length = len(result.prompt_token_ids)
    cost = result.cost
    assert len(result.completions) == 4
    assert cost.prompt_tokens_computed == prompt_length
    assert cost.prompt_tokens_reused == 3 * prompt_length
    assert cost.generated_tokens == 24
    assert cost.model_calls == 1 + 5  # one prefill, then one batched step per fed-back token
    # FLOPs by hand: the prompt once, then 5 fed-back tokens per row at growing context
    by_hand = sum(model.flops_per_token(i + 1) for i in range(prompt_length))
    by_hand += 4 * sum(model.flops_per_token(prompt_length + i + 1) for i in range(5))
    assert cost.flops == pytest.approx(by_hand, rel=1e-9)
    assert cost.wall_seconds > 0


def test_forward_flops_is_the_sum_over_positions():
    class Linear:
        @staticmethod
        def flops_per_token(context):
            return 100.0 + 3.0 * context

    assert forward_flops(Linear, 7, 5) == sum(100.0 + 3.0 * (7 + i + 1) for i in range(5))
    assert forward_flops(Linear, 7, 0) == 0.0


def test_seeded_local_generation_is_reproducible(model):
    generator = LocalGenerator(model)
    params = SamplingParams(temperature=1.0, max_tokens=5, n=2, seed=11)
    first = generator.generate("Hello", params)
    second = generator.generate("Hello", params, generator=torch.Generator().manual_seed(11))
    assert [c.token_ids for c in first.completions] == [c.token_ids for c in second.completions]
