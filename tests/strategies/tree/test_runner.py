"""Tree searches by name (registry / CLI budgets) and option checks."""

import pytest
import torch

from metagen.decoding import Generator, LocalGenerator
from metagen.sampling import SamplingParams
from metagen.strategies.registry import STRATEGIES, StrategyOptions, check_options, get_strategy
from tests.decoding.toy_model import ToyModel

VALUE_STRATEGIES = [name for name, spec in STRATEGIES.items() if spec.uses_value]


def test_the_registry_lists_every_search():
    assert set(VALUE_STRATEGIES) == {"best_of_n_value", "step_beam", "dvts", "rebase", "mcts", "astar",
                                     "particle_filter", "blockwise_cd", "tokenwise_cd", "transfer_q"}


@pytest.mark.parametrize("name", VALUE_STRATEGIES)
def test_each_search_runs_by_name_with_budget_n(name, one_thread):
    model = ToyModel()
    spec = get_strategy(name)
    options = StrategyOptions(value="steps", step_delimiter="b")
    result = spec.run(LocalGenerator(model), "a", 4, SamplingParams(temperature=1.0, max_tokens=6), options,
                      torch.Generator().manual_seed(0))
    assert result.completions and result.chosen in result.completions
    if name == "transfer_q":  # the model is its own baseline: its rollouts' forwards are calls too
        assert result.cost.model_calls == len(model.calls) > 1 + result.cost.generated_tokens // 4
        assert result.cost.generated_tokens == result.cost.target_steps
    elif spec.is_pooled(options):  # best_of_n_value, valued by the text alone: 4 samples in one batched call
        assert len(result.completions) == 4 and result.cost.generated_tokens == sum(
            len(c.token_ids) for c in result.completions)
    else:
        assert result.cost.generated_tokens == sum(len(call) for call in model.calls[1:])
    assert all(c.score == 0.5 for c in result.completions)  # no equations in toy text: neutral


def test_searches_need_a_value_and_a_local_model(one_thread):
    spec = get_strategy("rebase")
    with pytest.raises(ValueError, match="needs a value"):
        spec.run(LocalGenerator(ToyModel()), "a", 4, SamplingParams(), StrategyOptions(), None)

    class Remote(Generator):
        def generate(self, prompt, params, *, generator=None):
            raise AssertionError("a search on a generator without a local cache must not generate")

    with pytest.raises(ValueError, match="strategy 'rebase' needs local_cache, which Remote does not provide"):
        spec.run(Remote(), "a", 4, SamplingParams(), StrategyOptions(value="steps"), None)


def test_options_nobody_reads_are_refused():
    check_options(["rebase", "greedy"], StrategyOptions(value="steps"))
    with pytest.raises(ValueError, match="value='steps' is given, but no chosen strategy uses a value"):
        check_options(["greedy", "self_consistency"], StrategyOptions(value="steps"))
    with pytest.raises(ValueError, match="step_delimiter='. '"):
        check_options(["greedy"], StrategyOptions(step_delimiter=". "))


def test_aggregation_reaches_the_search(one_thread):
    options = StrategyOptions(pattern="([abc])", value="steps", step_delimiter="b", aggregation="majority")
    result = get_strategy("rebase").run(LocalGenerator(ToyModel()), "a", 8,
                                        SamplingParams(temperature=1.0, max_tokens=6), options,
                                        torch.Generator().manual_seed(0))
    answers = [c.answer for c in result.completions if c.answer is not None]
    assert result.votes == {a: float(answers.count(a)) for a in dict.fromkeys(answers)}
    assert result.chosen.answer == max(result.votes, key=result.votes.get)
    with pytest.raises(ValueError, match="aggregation='majority' is given"):
        check_options(["greedy"], StrategyOptions(aggregation="majority"))


def test_searches_reach_the_model_through_local_model_only(one_thread):
    """The runner takes the model and chat setting from `local_model()`: a generator with
    LOCAL_CACHE and no `model` attribute runs; one with a `model` attribute but without
    LOCAL_CACHE is refused (no guessing from attributes)."""
    from metagen.decoding import capabilities as caps
    from metagen.decoding.generator import LocalModel

    model = ToyModel()

    class Wrapped(Generator):
        capabilities = frozenset({caps.LOCAL_CACHE})

        def local_model(self):
            return LocalModel(model, None)

        def generate(self, prompt, params, *, generator=None):
            raise AssertionError("searches decode their own steps")

    options = StrategyOptions(value="steps", step_delimiter="b")
    result = get_strategy("rebase").run(Wrapped(), "a", 4, SamplingParams(temperature=1.0, max_tokens=6), options,
                                        torch.Generator().manual_seed(0))
    assert result.completions and len(model.calls) > 1

    class HasAModel(Generator):
        def __init__(self):
            self.model = ToyModel()

        def generate(self, prompt, params, *, generator=None):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="strategy 'rebase' needs local_cache, which HasAModel does not provide"):
        get_strategy("rebase").run(HasAModel(), "a", 4, SamplingParams(), options, None)
