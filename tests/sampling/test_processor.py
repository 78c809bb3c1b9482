"""The LogitsProcessor contract for every stateful processor: rollback undoes accept exactly,
reset returns to the prompt's state, fork / select / concat keep rows independent."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import (
    LogitBias,
    LogitsProcessor,
    Mirostat,
    NoRepeatNgramState,
    PenaltyState,
    SamplerChain,
    SamplingParams,
    StatelessProcessor,
    bias_vector,
    temperature,
)
from tests.decoding.ban_repeats import BanRepeats, EndAfter

VOCAB = 12
PROMPTS = [[1, 2, 3, 1], [4, 5], [2, 2, 2]]


def penalties():
    return PenaltyState.from_prompt(PROMPTS, 3, VOCAB, repetition_penalty=1.4, frequency_penalty=0.3,
                                    presence_penalty=0.2)


def ngrams():
    return NoRepeatNgramState.from_prompt(2, PROMPTS, 3, max_new_tokens=2)  # small: the buffer must grow


def mirostat():
    return Mirostat(tau=2.0, learning_rate=0.3, mu=torch.tensor([3.0, 4.0, 5.0]))


STATEFUL = {"penalties": penalties, "ngrams": ngrams, "mirostat": mirostat}


def logits_at(step: int) -> torch.Tensor:
    return torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(step)) * 2


def state_of(processor) -> list[torch.Tensor]:
    """Every tensor that defines the processor's behaviour."""
    if isinstance(processor, PenaltyState):
        return [processor.counts, processor.seen]
    if isinstance(processor, NoRepeatNgramState):
        return [processor.history]
    return [processor.mu]


def run(processor, steps: list[list[int]], start: int = 0) -> None:
    """apply then accept each step's tokens (what a decoding loop does)."""
    for i, tokens in enumerate(steps):
        processor.apply(logits_at(start + i))
        processor.accept(torch.tensor(tokens))


def assert_same(one, two) -> None:
    for a, b in zip(state_of(one), state_of(two), strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    for step in range(3):
        assert torch.equal(one.apply(logits_at(100 + step)), two.apply(logits_at(100 + step)))


PREFIX = [[3, 4, 5], [6, 6, 1]]  # accepted before the part that is rolled back
DRAFT = [[7, 8, -1], [7, 1, 2], [8, -1, 3]]  # per step; rows accept 3, 2 and 2 tokens (-1: skipped)
DRAFTED = torch.tensor([3, 2, 2])


@pytest.mark.parametrize("name", STATEFUL)
def test_accept_k_then_rollback_k_is_never_accepting(name):
    kept, rolled = STATEFUL[name](), STATEFUL[name]()
    run(kept, PREFIX)
    run(rolled, PREFIX)
    run(rolled, DRAFT, start=2)
    rolled.rollback(DRAFTED)
    assert_same(rolled, kept)


@pytest.mark.parametrize("name", STATEFUL)
def test_uneven_rollback_keeps_each_rows_own_prefix(name):
    # Row 0 keeps two of its drafted tokens, row 1 none, row 2 both: as if it accepted that much.
    rolled, expected = STATEFUL[name](), STATEFUL[name]()
    run(rolled, PREFIX + DRAFT)
    rolled.rollback(torch.tensor([1, 2, 0]))
    run(expected, PREFIX + [[7, -1, -1], [7, -1, 2], [-1, -1, 3]])  # DRAFT without the removed
    for a, b in zip(state_of(rolled), state_of(expected)):
        if isinstance(rolled, NoRepeatNgramState):  # the same tokens, holes in other columns
            from metagen.sampling._tokens import left_aligned

            a, b = left_aligned(a), left_aligned(b)
            width = max(a.shape[1], b.shape[1])
            a = torch.nn.functional.pad(a, (width - a.shape[1], 0), value=-1)
            b = torch.nn.functional.pad(b, (width - b.shape[1], 0), value=-1)
        assert torch.equal(a, b)
    assert torch.equal(rolled.apply(logits_at(50)), expected.apply(logits_at(50)))


@pytest.mark.parametrize("name", STATEFUL)
def test_reset_is_the_state_after_the_prompt(name):
    used, fresh = STATEFUL[name](), STATEFUL[name]()
    run(used, PREFIX + DRAFT)
    used.reset()
    assert_same(used, fresh)


@pytest.mark.parametrize("name", STATEFUL)
def test_rollback_beyond_what_was_accepted_is_refused(name):
    processor = STATEFUL[name]()
    run(processor, [[1, -1, 2]])
    with pytest.raises(ValueError, match="rollback of 1 tokens in row 1, which accepted 0"):
        processor.rollback(torch.tensor([0, 1, 0]))


@pytest.mark.parametrize("name", STATEFUL)
def test_fork_select_and_concat_keep_rows_independent(name):
    base = STATEFUL[name]()
    run(base, PREFIX)
    # concat(fork([2]), fork([0, 1])) is select([2, 0, 1]) of the same state.
    joined = type(base).concat([base.fork(torch.tensor([2])), base.fork(torch.tensor([0, 1]))])
    selected = base.fork(torch.tensor([0, 1, 2]))
    selected.select(torch.tensor([2, 0, 1]))
    assert_same(joined, selected)
    # The joined rows roll back what they accepted after the join, and only that.
    run(joined, DRAFT, start=7)
    joined.rollback(DRAFTED)
    assert_same(joined, selected)
    before = [t.clone() for t in state_of(base)]
    run(selected, [[9, 9, 9]])
    assert all(torch.equal(a, b) for a, b in zip(before, state_of(base)))  # forks never touch base


def test_concat_of_different_history_lengths_rolls_back_each_row():
    one, two = ngrams(), ngrams()
    run(one, PREFIX)
    joined = NoRepeatNgramState.concat([one.fork(torch.tensor([0])), two.fork(torch.tensor([1]))])
    joined.accept(torch.tensor([10, 11]))
    joined.rollback(torch.tensor([1, 1]))
    assert joined.history.tolist()[0][-5:] == [2, 3, 1, 3, 6]  # row 0: prompt + its two tokens
    assert [t for t in joined.history.tolist()[1] if t >= 0] == [4, 5]
    with pytest.raises(ValueError, match="row 1, which accepted 0"):
        joined.rollback(torch.tensor([0, 1]))


def test_penalty_counts_are_restored_exactly_when_a_token_repeats():
    state = PenaltyState.from_prompt([1], 1, 4, frequency_penalty=1.0, repetition_penalty=2.0)
    state.accept(torch.tensor([2]))
    state.accept(torch.tensor([2]))
    state.accept(torch.tensor([1]))
    state.rollback(torch.tensor([2]))
    assert state.counts.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    assert state.seen.tolist() == [[False, True, True, False]]  # 1 from the prompt stays seen


def test_mirostat_rollback_restores_the_mu_before_the_removed_tokens():
    sampler = Mirostat(tau=1.0, learning_rate=0.5, mu=torch.tensor([4.0]))
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    mus = [4.0]
    for token in (1, 2, 0):
        sampler.apply(logits)
        sampler.accept(torch.tensor([token]))
        mus.append(float(sampler.mu))
    assert mus[1] == pytest.approx(4.0 - 0.5 * (2 - 1.0))  # surprise of token 1 is 2 bits
    for k in (1, 2):
        sampler.rollback(torch.tensor([1]))
        assert float(sampler.mu) == mus[3 - k]


def test_stateless_processors_ignore_the_protocol_and_share_themselves():
    scale = StatelessProcessor("temperature", lambda z: temperature(z, 0.5), argmax_invariant=True)
    assert scale.stateless and scale.batch_size is None and scale.fork(torch.tensor([0, 0])) is scale
    scale.accept(torch.tensor([1]))
    scale.rollback(torch.tensor([1]))
    assert torch.equal(scale.apply(torch.ones(1, 3)), torch.full((1, 3), 2.0))
    bias = LogitBias(bias_vector({2: -3.0}, 4))
    logits = torch.zeros(2, 4)
    assert bias.apply(logits).tolist() == [[0, 0, -3, 0]] * 2 and logits.eq(0).all()
    assert not bias.argmax_invariant


def test_the_contract_is_enforced():
    class Forgetful(LogitsProcessor):  # no rollback
        batch_size = 1

        def apply(self, logits):
            return logits

        def accept(self, tokens):
            pass

        def select(self, indices):
            pass

        def fork(self, indices):
            return self

        def reset(self):
            pass

    with pytest.raises(TypeError, match="rollback"):
        Forgetful()
    with pytest.raises(NotImplementedError, match="concat"):
        LogitsProcessor.concat([])


# ------------------------------------------------------------------------------ the chain


def test_chain_rollback_reset_and_concat_pass_through():
    params = SamplingParams(presence_penalty=1.0, no_repeat_ngram_size=2, temperature=0.8)
    chain = SamplerChain.from_params(params, 2, VOCAB, prompt_ids=[1, 2])
    fresh = SamplerChain.from_params(params, 2, VOCAB, prompt_ids=[1, 2])
    chain.accept(torch.tensor([3, 4]))
    chain.accept(torch.tensor([5, -1]))
    chain.rollback(torch.tensor([1, 0]))
    fresh.accept(torch.tensor([3, 4]))
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    assert torch.equal(chain.process(logits), fresh.process(logits))
    chain.reset()
    assert torch.equal(chain.process(logits), SamplerChain.from_params(params, 2, VOCAB, [1, 2]).process(logits))
    joined = SamplerChain.concat([fresh.fork(torch.tensor([1])), fresh.fork(torch.tensor([0]))])
    assert torch.equal(joined.process(logits[[1, 0]]), fresh.process(logits)[[1, 0]])


def test_masks_run_first_on_rows_forked_from_the_given_state():
    mask = BanRepeats([[2]])  # the state after the prompt: token 2 banned
    params = SamplingParams(logit_bias={2: 5.0, 3: 1.0}, top_k=1)
    chain = SamplerChain.from_params(params, 3, 4, masks=[mask])
    assert chain.names == ("ban_repeats", "logit_bias", "top_k")
    # top_k after the mask keeps the best *allowed* token (3), never the banned favourite (2).
    assert chain.next_tokens(torch.zeros(3, 4)).tolist() == [3, 3, 3]
    assert mask.histories == [[2]]  # the caller's object is not changed
    assert chain.processors[0].histories == [[2, 3]] * 3
    with pytest.raises(ValueError, match="has 2 rows: give it with 1 row"):
        SamplerChain.from_params(params, 3, 4, masks=[BanRepeats([[], []])])


def test_greedy_chain_skips_stateless_argmax_invariant_processors():
    calls = []
    spy = StatelessProcessor("spy", lambda z: calls.append(1) or z, argmax_invariant=True)
    ban = BanRepeats([[]])
    chain = SamplerChain([spy, ban], greedy=True)
    assert chain.names == ("ban_repeats",) and calls == []
    assert chain.next_tokens(torch.tensor([[0.0, 2.0, 1.0]])).tolist() == [1]
    assert chain.next_tokens(torch.tensor([[0.0, 2.0, 1.0]])).tolist() == [2]
    assert calls == []


def test_stop_verdict_asks_only_processors_with_an_opinion():
    plain = SamplerChain.from_params(SamplingParams(presence_penalty=1.0), 1, 4)
    assert not plain.judges_stop and plain.stop_verdict(0) == (None, False)
    judge = EndAfter([[]], stop_after=2, min_tokens=1)
    chain = SamplerChain([judge])
    assert chain.judges_stop and chain.stop_verdict(0) == (False, False)
    chain.accept(torch.tensor([1]))
    assert chain.stop_verdict(0) == (True, False)
    chain.accept(torch.tensor([2]))
    assert chain.stop_verdict(0) == (True, True)
    assert chain.forced(0) == [] and math.isfinite(chain.batch_size)
