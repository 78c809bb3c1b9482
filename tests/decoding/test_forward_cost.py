"""`forward_cost` / `prefill_cost`: one forward's Cost, and every decoding loop counts through them.

The toy model's FLOPs per token are 100 + context (`ToyModel.flops_per_token`), so a token fed at
position s costs 101 + s and every figure below can be checked by hand. `LedgerModel` writes down
each forward the loops really run (each row's cache length before it and its new tokens); a
loop's Cost must be the sum of `forward_cost` over that ledger.
"""

import importlib

import pytest
import torch

from metagen.decoding import cost as cost_module
from metagen.decoding.beam_search import BeamSearchConfig, beam_search
from metagen.decoding.cost import Cost, forward_cost, forward_flops, prefill_cost
from metagen.decoding.sample_loop import generate
from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import FunctionValue
from metagen.serve.engine_generator import engine_cost
from metagen.speculative import NgramDrafter, SpeculativeConfig, speculative_generate
from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tokenwise_cd
from metagen.strategies.tree.expand import StepExpander
from metagen.strategies.tree.node import StepConfig
from tests.decoding.toy_model import A, BOS, C, ToyModel


class LedgerModel(ToyModel):
    """The toy model, recording per forward (each row's cache length before it, its new tokens)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ledger: list[tuple[list[int], list[int]]] = []

    def forward(self, cache, tokens, **kwargs):
        starts = list(cache.lengths)
        out = super().forward(cache, tokens, **kwargs)
        self.ledger.append((starts, list(self.calls[-1])))
        return out


def ledger_flops(model: LedgerModel) -> float:
    return sum(forward_flops(model, s, c) for starts, counts in model.ledger for s, c in zip(starts, counts))


def ledger_rows(model: LedgerModel, skip_first: bool = False) -> int:
    return sum(len(starts) for starts, _ in model.ledger[1 if skip_first else 0:])


def test_forward_cost_by_hand():
    model = ToyModel()
    cost = forward_cost(model, [2, 5], [1, 3])
    # row 0: one token at position 2 (101 + 2); row 1: positions 5, 6, 7 (106 + 107 + 108)
    assert cost.flops == 103 + 321
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (1, 2, 0)
    assert forward_cost(model, [2, 5], produced=False).target_steps == 0
    assert forward_cost(model, [2, 5]).flops == 103 + 106  # one token per row by default
    with pytest.raises(ValueError, match="counts has 1 entries for 2 rows"):
        forward_cost(model, [2, 5], [1])


def test_prefill_cost_by_hand():
    model = ToyModel()
    cost = prefill_cost(model, 4, 3)  # positions 0..3 once: 101 + 102 + 103 + 104
    assert (cost.model_calls, cost.flops, cost.prompt_tokens_computed, cost.prompt_tokens_reused,
            cost.target_steps) == (1, 410, 4, 8, 3)
    reused = prefill_cost(model, 4, 3, reused=True)
    assert (reused.model_calls, reused.flops, reused.prompt_tokens_reused, reused.target_steps) == (0, 0, 12, 3)
    assert prefill_cost(model, 4, 3, produced=False).target_steps == 0


def test_unknown_flops_stay_unknown():
    cost = Cost(flops=None)
    cost += forward_cost(ToyModel(), [0, 1])
    assert cost.flops is None and cost.model_calls == 1


def test_sample_loop_by_hand():
    model = ToyModel()
    result = generate(model, [BOS], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, n=2))
    cost = result.cost
    # prefill 101; two decode forwards of 2 rows at positions 1 and 2 (the third tokens are not fed)
    assert cost.flops == 101 + 2 * 102 + 2 * 103
    assert (cost.model_calls, cost.target_steps, cost.generated_tokens) == (3, 2 + 2 + 2, 6)


def test_beam_search_by_hand():
    model = ToyModel()
    result = beam_search(model, [BOS, A], BeamSearchConfig(width=2, max_tokens=3, ignore_eos=True, n_best=2))
    cost = result.cost
    # prefill of 2 tokens (101 + 102), then one forward of the 2 live beams after steps 1 and 2
    assert cost.flops == 203 + 2 * 103 + 2 * 104
    # a target step per live beam per step: the prompt's one row, then 2 beams twice
    assert (cost.model_calls, cost.target_steps) == (3, 1 + 2 + 2)


def _spy(monkeypatch) -> list[int]:
    """Count the calls of `forward_cost` (every module's reference to it); returns the counter."""
    calls = []
    real = cost_module.forward_cost

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    for module in ("metagen.decoding.cost", "metagen.decoding.batch", "metagen.decoding.draft_loop",
                   "metagen.strategies.tree.expand"):  # the sampling loop and beam search: RowBatch.forward
        monkeypatch.setattr(importlib.import_module(module), "forward_cost", spy)
    return calls


def _sample(model):
    return generate(model, [BOS, C], SamplingParams(temperature=1.0, max_tokens=6, n=3, seed=4)).cost


def _speculative(model):
    params = SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=1)
    return speculative_generate(model, NgramDrafter(max_ngram=2), [BOS, A, A, A], params,
                                SpeculativeConfig(num_draft_tokens=3)).cost


def _beam(model):
    return beam_search(model, [BOS], BeamSearchConfig(width=3, max_tokens=5, groups=1, n_best=3)).cost


def _diverse_beam(model):
    return beam_search(model, [BOS], BeamSearchConfig(width=4, groups=2, diversity_penalty=0.5, max_tokens=5)).cost


def _stochastic_beam(model):
    return beam_search(model, [BOS], BeamSearchConfig(width=3, stochastic=True, max_tokens=5),
                       generator=torch.Generator().manual_seed(2)).cost


def _tokenwise(model):
    config = TokenwiseCDConfig(n=3, top_k=4, strength=1.0, params=SamplingParams(temperature=1.0, max_tokens=5))
    value = FunctionValue(lambda prompt, continuation: 0.1 * continuation[-1])
    return tokenwise_cd(model, [BOS], value, config, rng=torch.Generator().manual_seed(5)).cost


def _expander(model):
    expander = StepExpander(model, [BOS], SamplingParams(temperature=1.0, max_tokens=6),
                            StepConfig(delimiter="b", max_step_tokens=3), generator=torch.Generator().manual_seed(3))
    children = expander.expand([expander.root], [4])[0]
    open_children = [child for child in children if not child.finished]
    expander.expand(open_children, [2] * len(open_children))
    return expander.cost


# loop -> whether its prefill counts a target step per row it is forked into (the beam's is one row)
LOOPS = {"sample": (_sample, 3), "speculative": (_speculative, 2), "beam": (_beam, 0),
         "diverse_beam": (_diverse_beam, 0), "stochastic_beam": (_stochastic_beam, 0),
         "tokenwise_cd": (_tokenwise, None), "expander": (_expander, None)}


@pytest.mark.parametrize("name", LOOPS)
def test_each_loop_counts_every_forward_through_forward_cost(name, monkeypatch):
    """model_calls, FLOPs and target steps are the sum of `forward_cost` over the forwards the
    model ran — one `forward_cost` per forward (prefill included, through `prefill_cost`)."""
    run, prefill_rows = LOOPS[name]
    calls = _spy(monkeypatch)
    model = LedgerModel()
    cost = run(model)
    assert len(model.ledger) > 2
    assert len(calls) == len(model.ledger) == cost.model_calls
    assert cost.flops == ledger_flops(model)
    if prefill_rows is None:  # every drawn token is fed: the forwards after the prefill, per row
        assert cost.target_steps == ledger_rows(model, skip_first=True) == cost.generated_tokens
    elif prefill_rows == 0:  # beam search: a step per live beam, the prefill's one row included
        assert cost.target_steps == ledger_rows(model)
    else:  # the prefill forked into n rows, then a step per row and forward
        assert cost.target_steps == prefill_rows + ledger_rows(model, skip_first=True)


def test_engine_cost_counts_as_the_sample_loop():
    """The serving engine's Cost of rows of given lengths is the sampling loop's for those rows."""
    model = ToyModel()
    result = generate(model, [BOS, A], SamplingParams(temperature=1.0, max_tokens=7, n=4, seed=11))
    lengths = [len(c.token_ids) for c in result.completions]
    assert len(set(lengths)) > 1  # rows ending at different steps
    engine = engine_cost(model, 2, lengths)
    for field in ("model_calls", "flops", "target_steps", "prompt_tokens_computed", "prompt_tokens_reused"):
        assert getattr(engine, field) == getattr(result.cost, field), field
