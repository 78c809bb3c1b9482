"""Speculative decoding under a constraint on the toy model (the DFA of tests/decoding/toy_grammar.py):
draft and target are both masked (the drafter samples through the target's chain, the n-gram
drafter's forbidden proposals have q = 0), acceptance is computed on the masked, renormalised
distributions, and rejected tokens are rolled back in the constraint — so the emitted sequences
follow exactly plain masked decoding's law, and greedy equals plain constrained greedy."""

from __future__ import annotations

import pytest

from metagen.decoding import generate
from metagen.sampling import SamplingParams
from metagen.speculative import ModelDrafter, NgramDrafter, SpeculativeConfig, speculative_generate

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_grammar import ToyGrammar, masked_law
from tests.decoding.toy_model import BOS, ToyModel

from .test_loop import DraftToyModel

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [BOS]


def drafter(kind: str):
    return ModelDrafter(DraftToyModel()) if kind == "model" else NgramDrafter(max_ngram=2)


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_sampled_speculative_follows_the_constrained_law(verify, kind):
    processor = ToyGrammar()
    params = SamplingParams(n=3000, max_tokens=5, seed=21)
    result = speculative_generate(ToyModel(), drafter(kind), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3, verify=verify), processors=[processor])
    assert_follows((tuple(c.token_ids) for c in result.completions), masked_law(PROMPT, 5))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens  # drafts taken and rejected
    assert processor.history == [[0]]  # the given processor is never changed


@pytest.mark.parametrize("kind", ["model", "ngram"])
@pytest.mark.parametrize("max_tokens", [2, 5, 9])
def test_greedy_speculative_equals_plain_constrained_greedy(kind, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    plain = generate(ToyModel(), PROMPT, params, processors=[ToyGrammar()]).completions[0]
    spec = speculative_generate(ToyModel(), drafter(kind), PROMPT, params, SpeculativeConfig(num_draft_tokens=3),
                                processors=[ToyGrammar()]).completions[0]
    assert spec.token_ids == plain.token_ids
    assert (spec.finish_reason, spec.complete) == (plain.finish_reason, plain.complete)
