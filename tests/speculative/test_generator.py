"""SpeculativeGenerator's contract: the completions of plain decoding (ids, logprobs, top
logprobs, certainties, stop strings) with the drafter's FLOPs in its Cost, but no model handed
out: searches, value heads and prompt scoring are refused before any request."""

import pytest
import torch

from metagen.decoding import LocalGenerator
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


@pytest.mark.parametrize("name", ["rebase", "tokenwise_cd", "best_of_n_value"])
def test_searches_are_refused_before_decoding(name):
    class Untouchable(ToyModel):
        def prefill(self, *args, **kwargs):
            raise AssertionError("a refused search ran the model")

    generator = SpeculativeGenerator(Untouchable(), NgramDrafter())
    with pytest.raises(ValueError, match=f"strategy '{name}' needs local_cache, which SpeculativeGenerator"):
        get_strategy(name).run(generator, "a", 4, SamplingParams(), StrategyOptions(value="steps"), None)
