"""Tree search on the embedded model: forked caches give the same numbers as fresh forwards."""

import pytest
import torch

from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import ArithmeticStepVerifier, HeadValue, StepRewardValue
from metagen.strategies.tree.expand import StepConfig, StepExpander
from metagen.strategies.tree.rebase import RebaseConfig, rebase

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have? Think step by step."


def test_nodes_match_a_fresh_forward_of_their_path(model_fp32, random_head):
    """fp32 weights: the forked decode path and one fresh prefill agree to float rounding."""
    model = model_fp32
    value = HeadValue(random_head(model))
    params = SamplingParams(temperature=1.0, max_tokens=48)
    expander = StepExpander(model, QUESTION, params, StepConfig("\n", 24), value,
                            generator=torch.Generator().manual_seed(0))
    first = expander.expand([expander.root], [3])[0]
    open_nodes = [n for n in first if not n.finished] or first[:1]
    second = expander.expand(open_nodes[:2], [2, 1])
    nodes = [n for group in second for n in group]
    assert nodes and all(n.depth == 2 for n in nodes)
    for node in nodes:
        ids = expander.prompt_ids + node.path_ids()
        out = model.forward(model.new_cache(1), torch.tensor([ids]), logits="all", hidden=True)
        logprobs = torch.log_softmax(out.logits[0], dim=-1)
        start = len(expander.prompt_ids)
        fresh = [float(logprobs[start - 1 + i, t]) for i, t in enumerate(node.path_ids())]
        assert node.path_logprobs() == pytest.approx(fresh, abs=2e-3)
        fresh_value = value.head(out.hidden[0, -1]).item()
        assert node.value == pytest.approx(fresh_value, abs=1e-4)
        assert node.length == len(ids)
        assert node.text == model.tokenizer.decode(node.path_ids(), skip_special_tokens=True)
        assert "\n" in model.tokenizer.decode(node.token_ids) or node.finished or len(node.token_ids) == 24
    cost = expander.cost
    assert cost.prompt_tokens_computed == len(expander.prompt_ids)
    assert cost.prompt_tokens_reused == 3 * len(expander.prompt_ids) + sum(
        n.length for n, c in zip(open_nodes[:2], [2, 1]) for _ in range(c))
    assert cost.scorer_flops == pytest.approx(value.head.flops_per_state * (1 + 3 + len(nodes)))


def test_rebase_with_the_step_verifier_on_the_model(model):
    value = StepRewardValue(ArithmeticStepVerifier(), model.tokenizer, QUESTION, "\n", how="min")
    config = RebaseConfig(params=SamplingParams(temperature=0.8, max_tokens=64), step=StepConfig("\n", 32),
                          width=4, max_steps=4, aggregation="weighted")
    result = rebase(model, QUESTION, value, config, rng=torch.Generator().manual_seed(0))
    assert result.completions and result.chosen in result.completions
    assert result.cost.prompt_reuse_fraction > 0.7
    for candidate in result.completions:
        assert candidate.score == value.values([], [candidate.token_ids]).values[0]


def test_value_head_of_another_model_is_refused(model, random_head):
    head = random_head(model)
    head.identity["hidden_size"] = "999"
    with pytest.raises(ValueError, match="hidden_size='999'"):
        StepExpander(model, QUESTION, SamplingParams(), StepConfig(), HeadValue(head))
