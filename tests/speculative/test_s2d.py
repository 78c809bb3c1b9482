"""S2D on toy sub-models: the selection and the stopping rule by hand, sampled sequences that
follow the target's law; on SmolLM2, greedy at a nested depth equals plain greedy."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.models.base import ForwardOutput
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.s2d import S2DDrafter, SortedDraft

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, A, B, C, ToyModel
from tests.speculative.test_loop import DRAFT_SHIFT, PROMPT, DraftToyModel, chain_distribution

pytestmark = pytest.mark.usefixtures("one_thread")


class ConfidenceModel(ToyModel):
    """At position i: probability c on token t for `script[i] = (t, c)`, the rest spread evenly;
    records every forward's tokens in `fed`."""

    def __init__(self, script: dict[int, tuple[int, float]]) -> None:
        super().__init__()
        self.script, self.fed = script, []

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        rows = [[int(t) for t in row] for row in tokens]
        self.fed.append(rows)
        last = []
        for cached, new in zip(cache.rows, rows):
            cached.extend(new)
            token, confidence = self.script[len(cached)]
            probs = torch.full((VOCAB,), (1 - confidence) / (VOCAB - 1)).index_fill_(0, torch.tensor([token]),
                                                                                     confidence)
            last.append(probs.log())
        return ForwardOutput(torch.stack(last), None, [len(new) for new in rows])


def test_selection_and_stop_by_hand():
    shallow = ConfidenceModel({2: (B, 0.9), 3: (C, 0.3), 4: (A, 0.8), 5: (C, 0.25)})
    deep = ConfidenceModel({3: (B, 0.7), 5: (A, 0.5)})
    drafter = S2DDrafter([shallow, deep], threshold=0.6)
    drafter.start([BOS], 1)
    chain = SamplerChain.from_params(SamplingParams(temperature=0), 1, VOCAB, [BOS, A])
    draft = drafter.propose([[BOS, A]], [6], chain, None)
    # position 2: shallow 0.9 -> b; 3: shallow 0.3 < 0.6, deep 0.7 -> b; 4: shallow 0.8 -> a;
    # 5: shallow 0.25, deep 0.5, both below: deep's a, and the draft ends there
    assert draft.tokens == [[B, B, A, A]]
    assert (drafter.selected, drafter.tried, draft.calls) == ([2, 2], [4, 2], 6)
    assert shallow.fed == [[[BOS, A]], [[B]], [[B]], [[A]]]
    assert deep.fed == [[[BOS, A, B]], [[B, A]]]  # the deep sub-model catches up on what it skipped


def test_confidence_one_keeps_the_length_and_zero_stays_shallow():
    script = {i: (C, 0.9) for i in range(2, 9)}
    drafter = S2DDrafter([ConfidenceModel(script), ConfidenceModel(script)], threshold=0.0)
    drafter.start([BOS], 1)
    chain = SamplerChain.from_params(SamplingParams(temperature=0), 1, VOCAB, [BOS, A])
    assert drafter.propose([[BOS, A]], [3], chain, None).tokens == [[C, C, C]]
    assert drafter.tried == [3, 0]
    with pytest.raises(ValueError, match="threshold=1.5"):
        S2DDrafter([ToyModel()], threshold=1.5)


class FlatToyModel(ToyModel):
    """A second draft: the toy logits flattened (more often below the threshold)."""

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        out = super().forward(cache, tokens, logits=logits, hidden=hidden)
        return out if out.logits is None else ForwardOutput(out.logits * 0.3 - DRAFT_SHIFT, None, out.num_new)


def test_sequences_follow_the_target_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=4)
    drafter = S2DDrafter([FlatToyModel(), DraftToyModel()], threshold=0.3)
    result = speculative_generate(ToyModel(), drafter, PROMPT, params, SpeculativeConfig(num_draft_tokens=3))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert min(drafter.selected) > 0  # both sub-models drafted


@pytest.mark.slow
def test_greedy_equals_plain_greedy_at_a_nested_depth(model_fp32):
    from metagen.speculative import early_exit_model

    from tests.speculative.test_real_model import PROMPTS, assert_same_greedy

    sorted_draft = SortedDraft(model_fp32, (4, 8), {20: 0.4, 30: 0.6})
    target = early_exit_model(model_fp32, 20)
    drafter = sorted_draft.drafter(target)
    assert math.isclose(drafter.threshold, 0.4)
    spec = assert_same_greedy(target, drafter, PROMPTS["grounded"], SpeculativeConfig(num_draft_tokens=4))
    assert spec.cost.draft_tokens > 0
    assert sorted_draft.drafter(model_fp32).threshold == 0.6
    with pytest.raises(ValueError, match="deeper than 8"):
        sorted_draft.drafter(early_exit_model(model_fp32, 6))
