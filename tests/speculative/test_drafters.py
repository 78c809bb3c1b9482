"""Drafters on their own: n-gram lookup proposals, memory of past outputs, the model drafter's
cache following the committed tokens, and argument checks."""

from __future__ import annotations

import pytest
import torch

from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import ModelDrafter, NgramDrafter, early_exit_model, quantized_model
from tests.decoding.toy_model import BOS, VOCAB, ToyModel, next_logits

pytestmark = pytest.mark.usefixtures("one_thread")


def greedy_chain(rows: int = 1) -> SamplerChain:
    return SamplerChain.from_params(SamplingParams(temperature=0), rows, VOCAB)


def test_prompt_lookup_copies_what_followed_the_latest_match():
    drafter = NgramDrafter(max_ngram=2, min_ngram=1)
    context = [7, 8, 9, 10, 11, 3, 8, 9]
    drafter.start(context, 1)
    draft = drafter.propose([context], [3], greedy_chain(), None)
    assert draft.tokens == [[10, 11, 3]]  # "8 9" occurred before, followed by 10 11 3
    assert draft.probs == [None]


def test_prompt_lookup_prefers_the_longest_suffix_and_extends_past_the_run():
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    # suffix (1, 2): longest match "5 1 2"? no — "1 2" occurs twice; the 3-gram "9 1 2" once
    context = [9, 1, 2, 4, 5, 1, 2, 6, 9, 1, 2]
    drafter.start(context, 1)
    assert drafter.propose([context], [2], greedy_chain(), None).tokens == [[4, 5]]
    # no earlier occurrence of the last token: nothing to propose
    fresh = [1, 2, 3]
    drafter.start(fresh, 1)
    assert drafter.propose([fresh], [4], greedy_chain(), None).tokens == [[]]


def test_lookup_follows_the_growing_context_and_respects_lengths():
    drafter = NgramDrafter(max_ngram=2)
    prompt = [1, 2, 3, 4, 1]
    drafter.start(prompt, 2)
    contexts = [prompt + [2], prompt + [5]]
    draft = drafter.propose(contexts, [2, 2], greedy_chain(2), None)
    assert draft.tokens == [[3, 4], []]
    assert drafter.propose(contexts, [0, 0], greedy_chain(2), None).tokens == [[], []]


def test_past_outputs_are_remembered_across_requests():
    drafter = NgramDrafter(max_ngram=2)
    drafter.start([5, 6], 1)
    drafter.finish([[20, 21, 22, 23]])
    context = [1, 2, 20, 21]
    drafter.start(context, 1)
    assert drafter.propose([context], [2], greedy_chain(), None).tokens == [[22, 23]]
    forgetful = NgramDrafter(max_ngram=2, remember_outputs=False)
    forgetful.finish([[20, 21, 22, 23]])
    forgetful.start(context, 1)
    assert forgetful.propose([context], [2], greedy_chain(), None).tokens == [[]]


def test_memory_is_bounded():
    drafter = NgramDrafter(max_ngram=1, memory_size=3)
    drafter.finish([list(range(10))])
    assert len(drafter.memory) == 3 and (8,) in drafter.memory


@pytest.mark.parametrize("fields", [{"max_ngram": 0}, {"min_ngram": 3, "max_ngram": 2}, {"memory_size": 0}])
def test_ngram_arguments_are_checked(fields):
    with pytest.raises(ValueError):
        NgramDrafter(**fields)


def test_model_drafter_proposes_the_draft_models_greedy_path_and_follows_rollbacks():
    model = ToyModel()
    drafter = ModelDrafter(model)
    prompt = [BOS, 1]
    drafter.start(prompt, 1)

    def greedy_path(context, count):
        context, path = list(context), []
        for _ in range(count):
            token = int(torch.argmax(next_logits(context)))
            path.append(token)
            context.append(token)
        return path

    draft = drafter.propose([prompt], [3], greedy_chain(), None)
    assert draft.tokens == [greedy_path(prompt, 3)]
    assert draft.calls == 3
    # the target accepted one token and corrected the next: the drafter rolls back and resumes
    committed = prompt + draft.tokens[0][:1] + [3]
    again = drafter.propose([committed], [2], greedy_chain(), None)
    assert again.tokens == [greedy_path(committed, 2)]
    assert drafter.cache.rows[0] == committed + again.tokens[0][:1]


def test_model_drafter_sampling_returns_the_distributions_it_drew_from():
    drafter = ModelDrafter(ToyModel())
    prompt = [BOS, 1]
    drafter.start(prompt, 2)
    chain = SamplerChain.from_params(SamplingParams(temperature=0.5), 2, VOCAB)
    draft = drafter.propose([prompt, prompt], [2, 1], chain, torch.Generator().manual_seed(0))
    assert [len(t) for t in draft.tokens] == [2, 1]
    expected_first = torch.softmax(next_logits(prompt) / 0.5, dim=-1)
    for probs in draft.probs:
        assert torch.allclose(probs[0], expected_first, atol=1e-6)
    second = torch.softmax(next_logits(prompt + draft.tokens[0][:1]) / 0.5, dim=-1)
    assert torch.allclose(draft.probs[0][1], second, atol=1e-6)


def test_confidence_stops_a_draft_early():
    drafter = ModelDrafter(ToyModel(), confidence=0.9)
    prompt = [BOS, 1]  # after "a" the toy model is nearly flat: the first token is not confident
    drafter.start(prompt, 1)
    assert len(drafter.propose([prompt], [4], greedy_chain(), None).tokens[0]) == 1
    with pytest.raises(ValueError, match="confidence"):
        ModelDrafter(ToyModel(), confidence=1.5)


def test_self_draft_builders_check_their_arguments(model):
    with pytest.raises(ValueError, match="num_layers"):
        early_exit_model(model, 0)
    with pytest.raises(ValueError, match="truncated"):
        early_exit_model(ToyModel(), 2)
    shallow = early_exit_model(model, 6)
    assert shallow.layers[0] is model.layers[0] and len(shallow.layers) == 6
    assert shallow.flops_per_token(10) < model.flops_per_token(10)
    with pytest.raises(ValueError, match="not cheaper"):
        quantized_model(model, "int8")  # int8 is not below the int4 target
    with pytest.raises(ValueError, match="dtype"):
        quantized_model(model, "int2")
