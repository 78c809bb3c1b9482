"""Masked decoding and jump-forward on the enumerable toy model with a toy DFA constraint
(tests/decoding/toy_grammar.py): the law of the samples, greedy = argmax over allowed tokens,
forced runs fed in one forward, cut by max_tokens, never past a processor that forbids a token."""

from __future__ import annotations

import math

import pytest
from metagen.decoding import generate
from metagen.sampling import SamplingParams

from .ban_repeats import BanRepeats
from .helpers import assert_follows
from .toy_grammar import TRANSITIONS, ToyGrammar, masked_law, walk
from .toy_model import BOS, EOS, A, B, C, ToyModel, next_logits, sequence_distribution, step_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [BOS]


def constrained(model, params, *, hints=False, jump_forward=True, extra=()):
    return generate(model, PROMPT, params, processors=[ToyGrammar(hints=hints), *extra], jump_forward=jump_forward)


@pytest.mark.parametrize("jump_forward, hints", [(False, False), (True, False), (True, True)])
def test_samples_follow_the_per_step_masked_law(jump_forward, hints):
    params = SamplingParams(max_tokens=5, n=3000, seed=11)
    result = constrained(ToyModel(), params, hints=hints, jump_forward=jump_forward)
    law = masked_law(PROMPT, 5)
    assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-9)
    assert_follows([tuple(c.token_ids) for c in result.completions], law)
    if jump_forward:
        assert result.forced_tokens > 0


def test_the_masked_law_is_not_the_conditioned_law_in_general():
    """p(y)·1[y valid]/Z would give "b EOS" its share of the model's joint; per-step masking gives
    it the mass of "b" among the allowed first tokens times p(EOS | b) renormalised over {a, b, EOS}."""
    law = masked_law(PROMPT, 5)
    joint = sequence_distribution(PROMPT, 5)
    valid = {y: p for y, p in joint.items() if walk(y) is not None and (y[-1] == EOS or len(y) == 5)}
    z = sum(valid.values())
    assert abs(law[(B, EOS)] - valid[(B, EOS)] / z) > 0.01


@pytest.mark.parametrize("jump_forward", [False, True])
@pytest.mark.parametrize("hints", [False, True])
def test_greedy_is_the_argmax_over_allowed_tokens(jump_forward, hints):
    completion = constrained(ToyModel(), SamplingParams(temperature=0, max_tokens=8), hints=hints,
                             jump_forward=jump_forward).completions[0]
    context, state, path = list(PROMPT), 0, []
    while len(path) < 8 and state != -1:
        logits = next_logits(context)
        allowed = list(TRANSITIONS[state])
        token = max(allowed, key=lambda t: float(logits[t]))
        path.append(token)
        context.append(token)
        state = TRANSITIONS[state][token]
    assert completion.token_ids == path


def test_a_forced_run_is_fed_in_one_forward_with_its_real_records():
    model = ToyModel()
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
    result = constrained(model, params)
    plain_model = ToyModel()
    plain = constrained(plain_model, params, jump_forward=False)
    completion = result.completions[0]
    assert completion.token_ids == plain.completions[0].token_ids
    assert completion.token_ids[:3] == [A, C, C]  # a, then the forced run c c
    assert model.calls[1] == [3]  # a + c c in one forward
    assert result.forced_tokens == sum(1 for call in model.calls[1:] for _ in range(call[0] - 1))
    assert result.cost.model_calls == len(model.calls) < plain.cost.model_calls
    assert result.cost.target_steps == result.cost.generated_tokens - result.forced_tokens  # a run: one step
    expected = step_logprobs(PROMPT, completion.token_ids)
    assert completion.logprobs == pytest.approx(expected, abs=1e-5)
    for mine, theirs in zip(completion.top_logprobs, plain.completions[0].top_logprobs, strict=True):
        assert mine.keys() == theirs.keys()
        assert list(mine.values()) == pytest.approx(list(theirs.values()), abs=1e-6)


def test_a_forced_run_is_cut_at_max_tokens():
    model = ToyModel()
    completion = constrained(model, SamplingParams(temperature=0, max_tokens=2)).completions[0]
    assert completion.token_ids == [A, C]
    assert (completion.finish_reason, completion.complete) == ("length", False)
    assert all(sum(call) <= 2 for call in model.calls[1:])


def test_stop_strings_apply_to_forced_tokens():
    on = constrained(ToyModel(), SamplingParams(temperature=0, max_tokens=8, stop="cc")).completions[0]
    off = constrained(ToyModel(), SamplingParams(temperature=0, max_tokens=8, stop="cc"), jump_forward=False)
    assert (on.text, on.finish_reason, on.stop_reason) == ("a", "stop", "cc")
    assert on.token_ids == off.completions[0].token_ids


@pytest.mark.parametrize("jump_forward", [False, True])
def test_a_forced_token_another_processor_bans_is_never_emitted(jump_forward):
    """Greedy path a c c: the second c is banned by BanRepeats; the constraint allows only c, so
    the chain has no token left and says so, with jump-forward as without."""
    with pytest.raises(ValueError, match="leave no token"):
        constrained(ToyModel(), SamplingParams(temperature=0, max_tokens=8), jump_forward=jump_forward,
                    extra=[BanRepeats(never_banned=[EOS])])


def test_a_hinted_token_another_processor_bans_falls_back_to_the_draw():
    """Hints propose b b from state 3; with b banned after its first use the loop takes what the
    chain allows instead, token for token as plain stepping."""
    params = SamplingParams(temperature=0, max_tokens=8)
    extra = lambda: [BanRepeats(never_banned=[EOS, C, A])]  # noqa: E731
    on = constrained(ToyModel(), params, hints=True, extra=extra()).completions[0]
    off = constrained(ToyModel(), params, hints=True, jump_forward=False, extra=extra()).completions[0]
    assert on.token_ids == off.token_ids
    assert on.token_ids.count(B) <= 1


@pytest.mark.parametrize("fields", [{}, {"mirostat_tau": 2.0}, {"logprobs": 2, "repetition_penalty": 1.3}],
                         ids=["plain", "mirostat", "records-penalty"])
def test_a_seeded_row_gets_the_same_tokens_on_and_off(fields):
    """Draw verification draws each token as plain decoding does, in its order: with a seed, a
    row gets the same tokens and records with jump-forward as without (Mirostat, whose state
    follows every draw, included). n > 1 rows leaving their runs at different positions share
    the generator in another order: the same law (test_samples_follow_the_per_step_masked_law),
    other seeded tokens."""
    forced = 0
    for seed in range(12):
        params = SamplingParams(max_tokens=8, seed=seed, **fields)
        on = constrained(ToyModel(), params, hints=True)
        off = constrained(ToyModel(), params, hints=True, jump_forward=False)
        mine, theirs = on.completions[0], off.completions[0]
        assert (mine.token_ids, mine.logprobs, mine.top_logprobs) == (theirs.token_ids, theirs.logprobs,
                                                                      theirs.top_logprobs), seed
        assert on.cost.model_calls == off.cost.model_calls - on.forced_tokens
        assert (on.cost.draft_tokens, on.cost.accepted_tokens) == (0, 0)  # run tokens count as forced, not drafts
        forced += on.forced_tokens
    assert forced > 0


def test_sampled_rows_with_runs_of_different_lengths_keep_their_own_state():
    """n rows draw different paths, so runs are ragged and some rows leave a hinted run early."""
    params = SamplingParams(max_tokens=6, n=64, seed=3)
    result = constrained(ToyModel(), params, hints=True)
    for completion in result.completions:
        state = walk(completion.token_ids)
        assert state is not None
        assert (completion.finish_reason == "stop") == (completion.token_ids[-1] == EOS)
        assert completion.complete is (state in (3, -1))


@pytest.mark.parametrize("jump_forward", [False, True])
def test_local_generator_passes_the_switch_and_counts_one_target_step_per_run(monkeypatch, jump_forward):
    import metagen.decoding.generator as module
    from metagen.decoding import LocalGenerator

    model = ToyModel()

    def constrained_generate(model, prompt, params, **kwargs):
        return generate(model, prompt, params, processors=[ToyGrammar()], **kwargs)

    monkeypatch.setattr(module, "generate", constrained_generate)
    result = LocalGenerator(model, jump_forward=jump_forward).generate(PROMPT, SamplingParams(temperature=0, max_tokens=8))
    assert (result.forced_tokens > 0) is jump_forward
    assert result.cost.target_steps == result.generated_tokens - result.forced_tokens == len(model.calls)
