"""PEARL on the toy models: sampled sequences follow the target's law, greedy output is plain
greedy output, and a scripted pair shows the pre-verify / post-verify schedule token by token."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import generate
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.pearl import PearlDrafter, pearl_verify
from metagen.speculative.registry import check_speculative, make_drafter

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, VOCAB, A, B, C, ToyModel
from tests.speculative.test_loop import PROMPT, DraftToyModel, chain_distribution

pytestmark = pytest.mark.usefixtures("one_thread")


class ScriptedModel(ToyModel):
    """Predicts `script[i]` for the token at position i whatever the context (a one-hot logit of
    10), and records the tokens of every row of every forward in `fed`."""

    def __init__(self, script: dict[int, int]) -> None:
        super().__init__()
        self.script, self.fed = script, []

    def forward(self, cache, tokens, *, logits="last", hidden=False) -> ForwardOutput:
        rows = [[int(t) for t in row] for row in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
        self.fed.append(rows)
        per_row = []
        for cached, new in zip(cache.rows, rows):
            steps = []
            for token in new:
                cached.append(token)
                steps.append(torch.zeros(VOCAB).index_fill_(0, torch.tensor([self.script[len(cached)]]), 10.0))
            per_row.append(steps)
        counts = [len(steps) for steps in per_row]
        if logits == "none":
            return ForwardOutput(None, None, counts)
        if logits == "last":
            return ForwardOutput(torch.stack([steps[-1] for steps in per_row]), None, counts)
        padded = torch.zeros(len(rows), max(counts), VOCAB)
        for b, steps in enumerate(per_row):
            padded[b, : len(steps)] = torch.stack(steps)
        return ForwardOutput(padded, None, counts)


def test_pearl_verify_by_hand():
    q = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # q/p = 0.5 for the first token, 1 for the second: all kept half the time, else the residual
    # norm(max(0, q0 - p0)) = token 0; all kept returns the last draft token, no bonus
    outcomes = {pearl_verify(torch.tensor([1, 2]), p, q, torch.Generator().manual_seed(s)) for s in range(40)}
    assert outcomes == {(1, 2), (0, 0)}
    with pytest.raises(ValueError, match="γ >= 1"):
        pearl_verify(torch.tensor([], dtype=torch.long), p[:0], q[:0])


@pytest.mark.parametrize("gamma", [2, 3])
@pytest.mark.parametrize("parallel", [False, True])
def test_sequences_follow_the_target_distribution(gamma, parallel):
    params = SamplingParams(n=3000, max_tokens=4, seed=5)
    drafter = PearlDrafter(DraftToyModel(), parallel=parallel)
    result = speculative_generate(ToyModel(), drafter, PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=gamma, verify="pearl"))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert result.cost.draft_tokens > 0 and drafter.stats.rounds > 0


def test_a_chain_rule_with_the_pearl_drafter_stays_lossless():
    # block verification draws the last token from q itself: e_1 is kept only when it matches
    params = SamplingParams(n=3000, max_tokens=4, seed=6)
    drafter = PearlDrafter(DraftToyModel(), parallel=True)
    result = speculative_generate(ToyModel(), drafter, PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3, verify="block"))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert drafter.stats.rounds > drafter.stats.pre_verify_rounds  # some rounds verified drafted tokens


def test_penalties_follow_the_target_distribution():
    params = SamplingParams(n=3000, max_tokens=4, seed=9, repetition_penalty=1.6, top_k=4)
    result = speculative_generate(ToyModel(), PearlDrafter(DraftToyModel(), parallel=False), PROMPT, params,
                                  SpeculativeConfig(num_draft_tokens=3, verify="pearl"))
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


@pytest.mark.parametrize("prompt", [[BOS], PROMPT])
def test_greedy_equals_plain_greedy(prompt):
    params = SamplingParams(temperature=0, max_tokens=9)
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(ToyModel(), PearlDrafter(DraftToyModel()), prompt, params,
                                SpeculativeConfig(num_draft_tokens=3, verify="pearl")).completions[0]
    assert (spec.token_ids, spec.text, spec.finish_reason) == (plain.token_ids, plain.text, plain.finish_reason)


def test_an_abandoned_stream_ends_the_drafters_request():
    """A consumer that stops reading mid-way (or a step that raises) still ends the drafter's
    request: PEARL's worker thread is shut down and torch's thread count is the caller's again."""
    from metagen.speculative import speculative_stream

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        drafter = PearlDrafter(DraftToyModel(), parallel=True, threads=1)
        stream = speculative_stream(ToyModel(), drafter, PROMPT, SamplingParams(max_tokens=9, seed=1),
                                    SpeculativeConfig(num_draft_tokens=3, verify="pearl"))
        next(stream)
        assert torch.get_num_threads() == 1 and drafter._executor is not None  # drafting in its thread
        stream.close()
        assert torch.get_num_threads() == 2 and drafter._executor is None
    finally:
        torch.set_num_threads(before)


def test_schedule_on_a_scripted_pair():
    # target: a b c a b c ...; the draft agrees except at position 4 (c instead of a)
    target_script = {i: (A, B, C)[(i - 1) % 3] for i in range(1, 20)}
    draft_script = {**target_script, 4: C}
    target, draft_model = ScriptedModel(target_script), ScriptedModel(draft_script)
    drafter = PearlDrafter(draft_model, parallel=False)
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    result = speculative_generate(target, drafter, [BOS], params, SpeculativeConfig(num_draft_tokens=3,
                                                                                     verify="pearl"))
    assert result.completions[0].token_ids == [A, B, C, A, B, C, A, B, C]
    # prefill, then per round the target runs t0 + D:
    #   1 pre:  [a]        draft b c c after "<s> a"   -> e1 = b kept, D = c c
    #   2 post: [b c c]    draft b c a after D         -> c kept, c rejected (a): back to pre
    #   3 pre:  [a]        draft b c a                 -> e1 = b kept, D = c a
    #   4 post: [b c a]    draft b c a after D         -> c a kept, e1 = b kept, D = c a
    #   5 pre:  [b]        no budget left to draft     -> c drawn from the target
    assert target.fed == [[[BOS]], [[A]], [[B, C, C]], [[A]], [[B, C, A]], [[B]]]
    # the draft catches up on what it lacks (the prompt and a, then its last token or the
    # correction), then steps on its own tokens: γ = 3 forwards a round
    assert draft_model.fed == [[[BOS, A]], [[B]], [[C]], [[C]], [[B]], [[C]], [[A]], [[B]], [[C]],
                               [[A]], [[B]], [[C]]]
    stats = drafter.stats
    assert (stats.rounds, stats.pre_verify_rounds, stats.draft_forwards) == (5, 3, 12)
    assert (stats.next_verified, stats.next_kept) == (3, 3)  # rounds 1, 3, 4; round 2 rejected inside D
    assert result.cost.model_calls == 1 + 5 + 12  # prefill + target rounds + draft forwards
    assert (result.cost.draft_tokens, result.cost.accepted_tokens) == (4, 3)


def test_registry_entry_and_its_options():
    spec, verify = check_speculative("pearl:early-exit")
    assert (spec.name, verify) == ("pearl", "pearl")
    with pytest.raises(ValueError, match="unknown"):
        check_speculative("pearl")
    with pytest.raises(ValueError, match="exit_layer"):
        make_drafter("pearl:draft.gguf", ToyModel(), exit_layer=3)
    with pytest.raises(ValueError, match="threads=0"):
        PearlDrafter(ToyModel(), threads=0)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [False, True])
def test_greedy_equals_plain_greedy_on_smollm2(model_fp32, parallel):
    from tests.speculative.test_real_model import PROMPTS, assert_same_greedy

    drafter = make_drafter("pearl:early-exit", model_fp32, exit_layer=12)
    drafter.parallel = parallel
    spec = assert_same_greedy(model_fp32, drafter, PROMPTS["grounded"], SpeculativeConfig(num_draft_tokens=4,
                                                                                          verify="pearl"))
    stats = drafter.stats
    assert stats.rounds == spec.cost.target_steps - 1  # every decode step is one round (the prefill aside)
    # γ = 4 draft forwards a round, fewer only where the token budget ends
    assert 4 * (stats.rounds - 3) <= stats.draft_forwards <= 4 * stats.rounds
