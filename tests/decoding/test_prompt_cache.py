"""PromptCache: a second generate call with the same prompt copies the stored keys and values
instead of computing the prompt, with outputs identical to a fresh prefill and a cost that counts
the prompt as reused; another prompt, another model and a model without a copyable cache are
prefilled as usual; a prompt past a sliding window is kept whole."""

import pytest
import torch

from metagen.decoding import LocalGenerator
from metagen.decoding.cost import forward_flops
from metagen.decoding.prompt_cache import PromptCache
from metagen.models import load
from metagen.sampling import SamplingParams
from metagen.strategies.adaptive_consistency import AdaptiveConsistencyConfig, adaptive_consistency

PARAMS = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=11, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, dtype="fp32")


def outputs(result):
    return [(c.token_ids, c.logprobs, c.top_logprobs) for c in result.completions]


def test_the_same_prompt_again_reuses_it_with_identical_outputs_and_no_prompt_flops(tiny):
    cached, plain = LocalGenerator(tiny, chat=False), LocalGenerator(tiny, chat=False, prompt_cache=False)
    first = cached.generate("Name a colour.", PARAMS)
    second = cached.generate("Name a colour.", PARAMS)
    fresh = plain.generate("Name a colour.", PARAMS)
    assert outputs(first) == outputs(second) == outputs(fresh)
    assert cached.prompt_cache.hits == 1 and cached.prompt_cache.misses == 1
    assert plain.prompt_cache is None
    length = len(fresh.prompt_token_ids)
    assert first.cost.prompt_tokens_computed == fresh.cost.prompt_tokens_computed == length
    assert first.cost.flops == fresh.cost.flops
    assert second.cost.prompt_tokens_computed == 0 and second.cost.prompt_tokens_reused == 3 * length
    assert second.cost.model_calls == fresh.cost.model_calls - 1
    assert second.cost.flops == pytest.approx(fresh.cost.flops - forward_flops(tiny, 0, length), rel=1e-12)
    assert second.cost.target_steps == fresh.cost.target_steps


def test_one_entry_another_prompt_replaces_it_and_one_row_cannot_change_the_stored_logits(tiny):
    generator = LocalGenerator(tiny, chat=False)
    one = SamplingParams(n=1, temperature=0.7, top_k=5, max_tokens=6, seed=2, ignore_eos=True)
    a = generator.generate("first prompt", one)
    generator.generate("second prompt", one)
    again = generator.generate("first prompt", one)  # the entry now holds the second prompt: a miss
    assert generator.prompt_cache.misses == 3 and generator.prompt_cache.hits == 0
    assert again.cost.prompt_tokens_computed == len(a.prompt_token_ids)
    hit = generator.generate("first prompt", one)
    hit2 = generator.generate("first prompt", one)  # top-k and temperature ran on the first hit's logits
    assert generator.prompt_cache.hits == 2
    assert outputs(hit) == outputs(hit2) == outputs(a)


def test_a_prompt_of_another_model_is_not_reused(tiny, tiny_checkpoint):
    other = load(tiny_checkpoint, dtype="fp32")
    cache = PromptCache()
    ids = [1, 2, 3, 4]
    _, _, reused = cache.prefill(tiny, ids, 2)
    _, _, reused_other = cache.prefill(other, ids, 2)
    _, out, reused_again = cache.prefill(other, ids, 2)
    assert (reused, reused_other, reused_again) == (False, False, True)
    assert out.logits.shape == (2, tiny.vocab_size)
    cache.clear()
    assert cache.prefill(other, ids, 1)[2] is False


def test_a_model_without_a_copyable_cache_is_prefilled_every_time():
    from tests.decoding.toy_model import ToyModel

    model = ToyModel(max_context=32)
    generator = LocalGenerator(model, chat=False)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=3, seed=0)
    results = [generator.generate([4, 1], params) for _ in range(2)]
    assert [r.cost.prompt_tokens_computed for r in results] == [2, 2]
    assert outputs(results[0]) == outputs(results[1])
    assert generator.prompt_cache.hits == 0


def test_jump_forward_and_adaptive_rounds_compute_the_prompt_once(tiny):
    """Adaptive self-consistency calls generate once per round with the same prompt: with the
    cache only the first round pays for the prompt, and the samples are those without it."""
    config = AdaptiveConsistencyConfig(n_max=5, round_size=1, threshold=0.999,
                                       params=SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    runs = {}
    for cached in (True, False):
        generator = LocalGenerator(tiny, chat=False, prompt_cache=cached)
        runs[cached] = adaptive_consistency(generator, "2 + 2 =", config, rng=torch.Generator().manual_seed(4))
    with_cache, without = runs[True], runs[False]
    assert [c.token_ids for c in with_cache.completions] == [c.token_ids for c in without.completions]
    rounds = len(without.completions)
    assert rounds == 5  # random weights never agree enough to stop early at 0.999
    length = without.cost.prompt_tokens_computed // rounds
    assert with_cache.cost.prompt_tokens_computed == length
    assert with_cache.cost.flops == pytest.approx(without.cost.flops - (rounds - 1) * forward_flops(tiny, 0, length))


@pytest.mark.slow
def test_a_prompt_past_the_sliding_window_is_kept_whole_and_decodes_as_a_fresh_prefill(tmp_path):
    """A tiny Mistral with sliding_window = 8 (its cache releases positions that left every
    row's window, past a margin of 64): a 100-token prompt is stored whole, and rows decoded
    from the copy, which release its old positions as they grow, match a fresh prefill."""
    from tests.models.families.tiny_checkpoints import build_hf_model, save_hf

    model = load(save_hf(build_hf_model("mistral", sliding_window=8, max_position_embeddings=1024), tmp_path),
                 dtype="fp32")
    prompt = list(range(10, 110))
    generator, plain = LocalGenerator(model, chat=False), LocalGenerator(model, chat=False, prompt_cache=False)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=80, seed=1, ignore_eos=True, logprobs=1)
    first = generator.generate(prompt, params)
    second = generator.generate(prompt, params)
    assert generator.prompt_cache.hits == 1 and second.cost.prompt_tokens_computed == 0
    assert outputs(first) == outputs(second) == outputs(plain.generate(prompt, params))
