"""The Generator contract (capabilities, local_model, context length) and LocalGenerator: one
prefill, n forked rows, and a Cost that adds up (unknown FLOPs stay unknown)."""

import pytest
import torch

from metagen.decoding import Cost, Generator, LocalGenerator
from metagen.decoding import capabilities as caps
from metagen.decoding.cost import forward_flops
from metagen.decoding.generator import LocalModel
from metagen.decoding.prompts import encode_prompt
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


def test_unknown_flops_are_absorbing_never_zero():
    known, unknown = Cost(model_calls=1, flops=5.0), Cost(model_calls=2, flops=None)
    assert (known + unknown).flops is None and (unknown + known).flops is None
    assert (known + unknown).model_calls == 3
    total = Cost()
    total += known
    assert total.flops == 5.0
    total += unknown
    assert total.flops is None
    assert known.scaled(0.5) == Cost(model_calls=0.5, flops=2.5)
    assert unknown.scaled(0.5).flops is None


class Minimal(Generator):
    """A custom generator that only implements `generate` (and must not be asked to here)."""

    def generate(self, prompt, params, *, generator=None):
        raise AssertionError("not called")


def test_the_base_generator_declares_nothing_and_knows_no_model():
    generator = Minimal()
    assert generator.capabilities == frozenset() and generator.chat is None
    assert generator.source_model() is None
    assert generator.max_context is None and generator.count_tokens("anything") is None
    with pytest.raises(ValueError, match="local_model\\(\\) needs local_cache, which Minimal does not provide"):
        generator.local_model()


def test_local_generator_declares_every_capability_and_hands_out_its_model():
    from tests.decoding.toy_model import ToyModel

    model = ToyModel(max_context=32)
    generator = LocalGenerator(model, chat=False)
    assert generator.capabilities == caps.ALL  # structured output included
    assert generator.local_model() == LocalModel(model, False)
    assert generator.source_model() is model
    assert generator.max_context == 32
    assert generator.count_tokens("abc") == len(encode_prompt(model.tokenizer, "abc", False))
    assert generator.count_tokens([1, 2, 3]) == 3


def test_require_names_what_every_missing_capability_and_its_provider():
    class Remote(Minimal):
        capabilities = frozenset({caps.LOGPROBS})

    caps.require({caps.LOGPROBS}, Remote(), "x")  # has it: nothing
    with pytest.raises(ValueError) as error:
        caps.require({caps.LOGPROBS, caps.FULL_DISTRIBUTIONS, caps.LOCAL_CACHE}, Remote(), "strategy 'y'")
    message = str(error.value)
    assert message.startswith("strategy 'y' needs full_distributions, local_cache, which Remote does not provide")
    assert caps.PROVIDERS[caps.FULL_DISTRIBUTIONS] in message and caps.PROVIDERS[caps.LOCAL_CACHE] in message
    with pytest.raises(ValueError, match="capability 'logprob' is not known"):
        caps.require({"logprob"}, Remote(), "x")


def test_an_object_that_is_not_a_generator_is_named():
    class Duck:
        def generate(self, prompt, params, *, generator=None):
            raise AssertionError("not called")

    with pytest.raises(TypeError, match="Duck declares no capabilities set: a generator subclasses"):
        caps.require({caps.LOGPROBS}, Duck(), "x")
