"""What a subset of a stored pool is charged: the cost of generating it alone."""

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval import EvalConfig, Problem
from metagen.eval.pool import sample_pool
from metagen.sampling import SamplingParams

PER_TOKEN = 2e9  # FLOPs per token run through the model


class FanOut(Generator):
    """A llama.cpp-style server: n samples as n requests, the 100-token prompt computed by each,
    every sample 11 tokens (10 fed back); FLOPs counted as 2e9 per token run."""

    def __init__(self, requests_per_call=None):
        self.requests_per_call = requests_per_call

    def generate(self, prompt, params, *, generator=None):
        completions = [Completion(f"The answer is {i}", list(range(11)), [-0.1] * 11, finish_reason="stop")
                       for i in range(params.n)]
        runs = params.n if self.requests_per_call is None else self.requests_per_call
        computed = 100 * runs
        flops = PER_TOKEN * (computed + 10 * params.n)
        cost = Cost(model_calls=11 * runs, prompt_tokens_computed=computed, prompt_tokens_reused=100 * params.n - computed,
                    generated_tokens=11 * params.n, flops=flops)
        return GenerationResult(completions, list(range(100)), cost=cost)


@pytest.mark.parametrize("runs, n, alone", [
    (None, 1, 110), (None, 2, 220), (None, 4, 440),  # one request per sample: the prompt each time
    (2, 2, 220), (2, 4, 440),  # n split into 2 chunks: the prompt twice for 4, charged n/N of it
])
def test_a_subset_of_a_pool_paid_per_sample_is_charged_what_it_costs_alone(runs, n, alone):
    """Four samples of a 100-token prompt, 11 tokens each: run alone, n samples cost n·(100 + 10)
    tokens through the model when the server computes the prompt per sample; the prompt's FLOPs
    are scaled like its tokens (n/N of what was reported), not charged as if it ran once."""
    config = EvalConfig(("self_consistency",), ns=(4,), params=SamplingParams(temperature=1.0))
    pool = sample_pool(FanOut(runs), "q", config.params, Problem("p", "q", "1"), config, None)
    cost = pool.subset_cost(list(range(n)))
    computed = pool.reported["prompt_tokens_computed"] * n / 4
    assert cost.flops == pytest.approx(PER_TOKEN * (computed + 10 * n))
    if runs is None:
        assert cost.flops == pytest.approx(PER_TOKEN * alone)
    whole = pool.subset_cost(range(4))
    assert whole.flops == pytest.approx(PER_TOKEN * (pool.reported["prompt_tokens_computed"] + 40))


def test_a_pool_computed_once_charges_one_prefill_per_subset():
    """A local batch computes the prompt once: any subset pays that one prefill plus its own decode."""

    class Batch(FanOut):
        def generate(self, prompt, params, *, generator=None):
            result = super().generate(prompt, params, generator=generator)
            result.cost = Cost(model_calls=11, prompt_tokens_computed=100, prompt_tokens_reused=100 * (params.n - 1),
                               generated_tokens=11 * params.n, flops=PER_TOKEN * (100 + 10 * params.n))
            return result

    config = EvalConfig(("self_consistency",), ns=(4,), params=SamplingParams(temperature=1.0))
    pool = sample_pool(Batch(), "q", config.params, Problem("p", "q", "1"), config, None)
    assert pool.subset_cost([0]).flops == pytest.approx(PER_TOKEN * 110)
    assert pool.subset_cost([0, 1]).flops == pytest.approx(PER_TOKEN * 120)


def test_a_pool_stored_with_the_prompt_split_as_if_run_once_is_read_split_by_what_was_computed():
    """A stored pool whose split charged the prompt as if it ran once (T = P + Σ(L − 1)) is read
    back with its total FLOPs split by the prompt tokens the call computed; a current one unchanged."""
    config = EvalConfig(("self_consistency",), ns=(4,), params=SamplingParams(temperature=1.0))
    pool = sample_pool(FanOut(), "q", config.params, Problem("p", "q", "1"), config, None)
    data = pool.to_dict()
    total = PER_TOKEN * 440
    data["prompt_flops"] = total * 100 / 140
    for sample in data["samples"]:
        sample["flops"] = total * 10 / 140
    from metagen.eval.pool import Pool

    old = Pool.from_dict(data)
    assert old.subset_cost([0]).flops == pytest.approx(PER_TOKEN * 110)
    again = Pool.from_dict(pool.to_dict())
    assert again.prompt_flops == pytest.approx(pool.prompt_flops)
    assert [s.flops for s in again.samples] == pytest.approx([s.flops for s in pool.samples])


def test_a_pool_through_two_models_is_not_read_as_paid_per_sample():
    """A contrastive pair computes the prompt once per model (2·P tokens) for the whole batch,
    and every decode token twice too: a subset pays one prefill in each model, not n/N of it."""

    class Pair(FanOut):
        def generate(self, prompt, params, *, generator=None):
            result = super().generate(prompt, params, generator=generator)
            result.cost = Cost(model_calls=22, prompt_tokens_computed=200, prompt_tokens_reused=200 * (params.n - 1),
                               generated_tokens=11 * params.n, flops=2 * PER_TOKEN * (100 + 10 * params.n))
            return result

    config = EvalConfig(("self_consistency",), ns=(4,), params=SamplingParams(temperature=1.0))
    pool = sample_pool(Pair(), "q", config.params, Problem("p", "q", "1"), config, None)
    assert not pool.per_sample and pool.models == 2
    one = pool.subset_cost([0])
    assert one.flops == pytest.approx(2 * PER_TOKEN * 110)
    assert one.prompt_tokens_computed == 200 and pool.subset_cost([0, 1]).prompt_tokens_reused == 200
