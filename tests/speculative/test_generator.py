"""SpeculativeGenerator's contract: the completions of plain decoding (ids, logprobs, top
logprobs, certainties, stop strings) with the drafter's FLOPs in its Cost, but no model handed
out: tokenwise CD, value heads and prompt scoring are refused before any request; step searches
continue prefixes through it."""

import pytest
import torch

from metagen.decoding import LocalGenerator, generate
from metagen.decoding import capabilities as caps
from metagen.sampling import SamplingParams
from metagen.speculative import ModelDrafter, NgramDrafter, SpeculativeConfig, SpeculativeGenerator
from metagen.strategies.registry import StrategyOptions, get_strategy
from tests.decoding.toy_model import BOS, A, ToyModel


def test_it_provides_what_its_completions_carry_and_no_local_cache():
    generator = SpeculativeGenerator(ToyModel(), NgramDrafter())
    withheld = {caps.LOCAL_CACHE, caps.HIDDEN_STATES, caps.PROMPT_SCORING}
    assert generator.capabilities == LocalGenerator.capabilities - withheld
    with pytest.raises(ValueError, match="local_model\\(\\) needs local_cache, which SpeculativeGenerator"):
        generator.local_model()
    assert generator.source_model() is generator.model  # its outputs follow the target's weights


def test_its_completions_carry_certainties_and_top_logprobs():
    model = ToyModel()
    generator = SpeculativeGenerator(model, ModelDrafter(ToyModel()), SpeculativeConfig(num_draft_tokens=2))
    params = SamplingParams(temperature=1.0, max_tokens=5, n=3, logprobs=2, ignore_eos=True)
    result = generator.generate([BOS, A], params, generator=torch.Generator().manual_seed(0))
    for completion in result.completions:
        assert len(completion.certainties) == len(completion.logprobs) == len(completion.token_ids) == 5
        assert len(completion.top_logprobs) == 5
    assert result.cost.flops is not None and result.cost.flops > 0


def test_tokenwise_cd_is_refused_before_decoding_and_step_searches_continue_prefixes():
    """Tokenwise CD scores every candidate token in the model's cache: refused. Step searches
    need only prefix continuation, which a speculative generator decodes speculatively."""

    class Untouchable(ToyModel):
        def prefill(self, *args, **kwargs):
            raise AssertionError("a refused search ran the model")

    generator = SpeculativeGenerator(Untouchable(), NgramDrafter())
    with pytest.raises(ValueError, match="strategy 'tokenwise_cd' needs local_cache, which SpeculativeGenerator"):
        get_strategy("tokenwise_cd").run(generator, "a", 4, SamplingParams(), StrategyOptions(value="steps"), None)
    for name in ("rebase", "best_of_n_value"):
        assert get_strategy(name).supported_by(generator, StrategyOptions(value="steps"))



def test_a_greedy_step_search_on_a_speculative_generator_equals_the_local_one(one_thread):
    """Steps continued by speculative decoding (lossless): the same tree as the local cache's."""
    from tests.strategies.tree.test_remote_search import GREEDY_SEARCHES

    local = GREEDY_SEARCHES["rebase"](ToyModel())
    speculative = GREEDY_SEARCHES["rebase"](SpeculativeGenerator(ToyModel(), NgramDrafter()))
    assert [c.token_ids for c in speculative.completions] == [c.token_ids for c in local.completions]
    assert speculative.chosen.token_ids == local.chosen.token_ids


@pytest.mark.parametrize("strategy", ["best_of_n_logprob", "self_consistency"])
def test_strategies_run_on_a_tree_drafter_by_name(one_thread, strategy):
    """`by_name` with tree options picks the multi-draft rule, and a strategy samples through it
    as through any generator: at temperature 0 every candidate is plain greedy's, drafted as trees."""
    from tests.speculative.test_tree import TreeToyModel

    generator = SpeculativeGenerator.by_name(TreeToyModel(), "ngram", tree_widths=(2, 2, 1))
    assert generator.drafter.proposes_trees and generator.config.verify == "multi-draft"
    from tests.speculative.test_ngram_tree import PROMPT  # "a" followed by "c" and by "b": trees branch

    params = SamplingParams(temperature=0, max_tokens=8)
    result = get_strategy(strategy).run(generator, PROMPT, 3, params, StrategyOptions(), None)
    plain = generate(ToyModel(), PROMPT, params).completions[0]
    assert [c.token_ids for c in result.completions] == [plain.token_ids] * 3
    assert result.chosen.token_ids == plain.token_ids
    assert result.cost.draft_tokens > result.cost.accepted_tokens > 0
