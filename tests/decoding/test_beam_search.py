"""Beam search and stochastic beam search on the enumerable toy model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from metagen.decoding import BeamSearchConfig, beam_search

from .helpers import assert_follows
from .test_sample_loop import argmax_path, text_of
from .toy_model import (BOS, EOS, VOCAB, A, B, C, ToyModel, enumerate_sequences, next_logits, sequence_distribution,
                         step_logprobs)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS]


def brute_force_ranking(prompt, max_tokens, alpha):
    """Every completion with its exact log-probability, best score (logp / len^α) first."""
    scored = []
    for sequence in enumerate_sequences(max_tokens):
        logprob = sum(step_logprobs(prompt, sequence))
        scored.append((logprob / len(sequence) ** alpha, logprob, sequence))
    return sorted(scored, reverse=True)


# -------------------------------------------------------------------------- deterministic


def reference_beam_search(prompt, width, alpha, max_tokens):
    """Beam search written out, in float64 and run to `max_tokens` with no early stop: each step
    the 2·width best candidates (cumulative log-prob) are scanned in order, one ending in EOS among
    the first `width` is a finished hypothesis, the others fill `width` beams. Every hypothesis
    (score, logp, tokens), best score first."""
    live, hypotheses = [((), 0.0)], []
    for _ in range(max_tokens):
        candidates = []
        for tokens, logprob in live:
            steps = torch.log_softmax(next_logits([*prompt, *tokens]).double(), dim=-1).tolist()
            candidates += [(logprob + steps[token], (*tokens, token)) for token in range(VOCAB)]
        candidates.sort(key=lambda candidate: candidate[0], reverse=True)
        live = []
        for rank, (logprob, tokens) in enumerate(candidates[:2 * width]):
            if tokens[-1] == EOS:
                if rank < width:
                    hypotheses.append((logprob / len(tokens) ** alpha, logprob, tokens))
                continue
            live.append((tokens, logprob))
            if len(live) == width:
                break
    hypotheses += [(logprob / len(tokens) ** alpha, logprob, tokens) for tokens, logprob in live]
    return sorted(hypotheses, reverse=True)


def test_the_early_stop_bounds_a_live_beam_at_the_longest_length():
    """Regression: the stop rule took a live beam's best normalised score at its current length,
    but for α > 0 and logp < 0, logp / L^α grows with L. With α = 1.5, two beams, four tokens:
    after step 3 "b EOS" (−0.480) and "a b EOS" (−0.498) are finished and the live "a a b" taken
    at length 3 (−0.655) is below both, so the search stopped and returned "b EOS", one step before
    "a a b EOS" (−0.454) finished. Taken at L = 4, the bound of "a a b" is −0.425 and it goes on."""
    by_hand = {tokens: sum(step_logprobs(PROMPT, tokens)) / len(tokens) ** 1.5
               for tokens in [(B, EOS), (A, B, EOS), (A, A, B, EOS)]}
    assert by_hand[(B, EOS)] == pytest.approx(-0.4796, abs=1e-4)
    assert by_hand[(A, A, B, EOS)] == pytest.approx(-0.4541, abs=1e-4)
    live = sum(step_logprobs(PROMPT, [A, A, B]))
    assert live / 3 ** 1.5 < by_hand[(A, B, EOS)] < live / 4 ** 1.5  # the old bound stops, the new one goes on
    result = beam_search(ToyModel(), PROMPT, BeamSearchConfig(width=2, n_best=2, length_penalty=1.5, max_tokens=4))
    best = result.completions[0]
    assert tuple(best.token_ids) == (A, A, B, EOS)
    assert best.score == pytest.approx(by_hand[(A, A, B, EOS)], abs=1e-5)
    assert [tuple(h.token_ids) for h in result.completions] == \
           [tokens for _, _, tokens in reference_beam_search(PROMPT, 2, 1.5, 4)[:2]]


@pytest.mark.parametrize("alpha", [-0.5, 0.0, 0.6, 1.5, 3.0])
@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("prompt", [[BOS], [BOS, A], [BOS, B], [BOS, A, C]])
def test_the_early_stop_never_changes_what_beam_search_returns(alpha, width, prompt):
    """Every setting of the toy model against beam search run to the end: stopping early may only
    skip hypotheses that could not enter the `width` best (the stop is a bound for α < 0 too)."""
    config = BeamSearchConfig(width=width, n_best=width, length_penalty=alpha, max_tokens=5)
    hypotheses = beam_search(ToyModel(), prompt, config).completions
    expected = reference_beam_search(prompt, width, alpha, 5)[:width]
    assert [tuple(h.token_ids) for h in hypotheses] == [tokens for _, _, tokens in expected]
    assert [h.score for h in hypotheses] == pytest.approx([score for score, _, _ in expected], abs=1e-5)


@pytest.mark.parametrize(("alpha", "best"), [(0.0, (B, EOS)), (1.0, (C, C, C)), (1.5, (C, C, C)), (-0.5, (B, EOS))])
def test_a_beam_as_wide_as_the_space_returns_every_sequence_in_exact_order(alpha, best):
    everything = len(enumerate_sequences(3))  # 1 + 4 + 16 finished, 64 cut at 3 tokens
    assert everything == 85
    config = BeamSearchConfig(width=everything, n_best=everything, length_penalty=alpha, max_tokens=3)
    result = beam_search(ToyModel(), PROMPT, config)
    expected = brute_force_ranking(PROMPT, 3, alpha)
    assert tuple(result.completions[0].token_ids) == expected[0][2] == best
    assert sorted(tuple(h.token_ids) for h in result.completions) == sorted(s for _, _, s in expected)
    scores = [h.score for h in result.completions]
    assert scores == sorted(scores, reverse=True)
    assert scores == pytest.approx([score for score, _, _ in expected], abs=1e-5)
    for hypothesis in result.completions:
        assert hypothesis.cumulative_logprob == pytest.approx(sum(step_logprobs(PROMPT, hypothesis.token_ids)), abs=1e-5)
        normalized = hypothesis.cumulative_logprob / len(hypothesis.token_ids) ** alpha
        assert hypothesis.score == pytest.approx(normalized, rel=1e-6, abs=1e-6)
        assert (hypothesis.finish_reason == "stop") == (hypothesis.token_ids[-1] == EOS)
    assert result.completions[0].text == text_of(list(best))


def test_the_exact_best_is_not_what_greedy_finds():
    # The point of the toy: greedy commits to "a" (0.45) and misses "b EOS" (0.33 · 0.78).
    assert argmax_path(PROMPT, 3) == [A, A, B]
    assert brute_force_ranking(PROMPT, 3, 0.0)[0][2] == (B, EOS)


def test_two_beams_already_find_the_most_likely_sequence():
    # Step 1 keeps "a" and "b"; step 2 finishes "b EOS" (0.26), which no later beam can beat.
    result = beam_search(ToyModel(), PROMPT, BeamSearchConfig(width=2, length_penalty=0.0, max_tokens=3))
    assert result.completions[0].token_ids == [B, EOS]
    assert result.completions[0].cumulative_logprob == pytest.approx(math.log(0.33 * 0.78), abs=0.01)
    assert result.completions[0].cumulative_logprob == pytest.approx(sum(step_logprobs(PROMPT, [B, EOS])), abs=1e-5)


@pytest.mark.parametrize("prompt", [[BOS], [BOS, A], [BOS, C], [BOS, A, C]])
@pytest.mark.parametrize("max_tokens", [1, 2, 4, 6])
def test_width_one_is_greedy(prompt, max_tokens):
    config = BeamSearchConfig(width=1, length_penalty=0.0, max_tokens=max_tokens)
    hypothesis = beam_search(ToyModel(), prompt, config).completions[0]
    path = argmax_path(prompt, max_tokens)
    assert hypothesis.token_ids == path
    assert (hypothesis.finish_reason == "stop") == (path[-1] == EOS)


@pytest.mark.parametrize("width", [2, 3, 5])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_n_best_are_distinct_exact_and_sorted(width, alpha):
    config = BeamSearchConfig(width=width, n_best=width, length_penalty=alpha, max_tokens=4)
    hypotheses = beam_search(ToyModel(), [BOS, A], config).completions
    assert len(hypotheses) == width
    assert len({tuple(h.token_ids) for h in hypotheses}) == width
    assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
    for h in hypotheses:
        assert h.cumulative_logprob == pytest.approx(sum(step_logprobs([BOS, A], h.token_ids)), abs=1e-5)
        assert EOS not in h.token_ids[:-1]
        assert len(h.token_ids) <= 4


def test_when_every_candidate_ends_no_unfinished_prefix_is_returned():
    # With "a" as a second EOS, the two best continuations of "b" (EOS 0.78, "a" 0.1) both end
    # the sequence: one beam finishes and the other is dropped, so no beam is left alive.
    model = ToyModel(eos_token_ids=(EOS, A))
    result = beam_search(model, [BOS, B], BeamSearchConfig(width=1, n_best=1, length_penalty=0.0, max_tokens=4))
    best = result.completions[0]
    assert best.token_ids == [EOS]
    assert best.finish_reason == "stop"
    assert best.cumulative_logprob == pytest.approx(step_logprobs([BOS, B], [EOS])[0], abs=1e-6)
    assert all(h.token_ids and h.token_ids[-1] in (EOS, A) for h in result.completions)


def test_beams_share_the_prompt_prefill_and_step_together():
    model = ToyModel()
    result = beam_search(model, PROMPT, BeamSearchConfig(width=3, max_tokens=4, length_penalty=0.0))
    assert model.calls[0] == [1]  # one prefill of one row
    assert all(len(call) <= 3 and set(call) == {1} for call in model.calls[1:])
    assert result.cost.model_calls == len(model.calls)


def test_beam_search_returns_the_cost_it_spent():
    """One prefill of the prompt, then one call per step; FLOPs of every beam fed at its position."""
    model = ToyModel()
    result = beam_search(model, PROMPT, BeamSearchConfig(width=3, max_tokens=4, length_penalty=0.0))
    cost, length = result.cost, len(PROMPT)
    assert cost.model_calls == len(model.calls)
    assert (cost.prompt_tokens_computed, cost.prompt_tokens_reused) == (length, 0)
    by_hand = sum(model.flops_per_token(i + 1) for i in range(length))
    by_hand += sum(len(call) * model.flops_per_token(length + step) for step, call in enumerate(model.calls[1:], 1))
    assert cost.flops == pytest.approx(by_hand, rel=1e-12)
    assert cost.generated_tokens >= sum(len(call) for call in model.calls[1:])  # every fed token was generated
    assert cost.wall_seconds > 0


def test_prompt_too_long_raises():
    with pytest.raises(ValueError, match="context"):
        beam_search(ToyModel(max_context=3), [BOS, A, A], BeamSearchConfig(width=2))


@pytest.mark.parametrize(
    "kwargs", [{"width": 0}, {"width": 2, "n_best": 3}, {"max_tokens": 0}, {"stochastic": True, "temperature": 0}]
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="out of range"):
        BeamSearchConfig(**kwargs)


# ----------------------------------------------------------------------------- stochastic

RUNS = 4000


def stochastic_runs(width, temperature, max_tokens=2, seed=0):
    """RUNS stochastic beam searches from one seeded generator; their hypotheses' token tuples."""
    model = ToyModel()
    generator = torch.Generator().manual_seed(seed)
    config = BeamSearchConfig(width=width, n_best=width, stochastic=True, temperature=temperature,
                              max_tokens=max_tokens)
    return [
        [tuple(h.token_ids) for h in beam_search(model, PROMPT, config, generator=generator).completions]
        for _ in range(RUNS)
    ]


def tempered(t):
    return None if t == 1.0 else (lambda z: z / t)


@pytest.mark.parametrize("width", [3, 6])
def test_stochastic_beams_are_distinct_sequences_with_exact_logprobs(width):
    generator = torch.Generator().manual_seed(1)
    config = BeamSearchConfig(width=width, n_best=width, stochastic=True, max_tokens=3)
    for _ in range(20):
        hypotheses = beam_search(ToyModel(), PROMPT, config, generator=generator).completions
        assert len(hypotheses) == width
        assert len({tuple(h.token_ids) for h in hypotheses}) == width
        for h in hypotheses:
            assert h.cumulative_logprob == pytest.approx(sum(step_logprobs(PROMPT, h.token_ids)), abs=1e-5)
            assert EOS not in h.token_ids[:-1]
            assert (h.finish_reason == "stop") == (h.token_ids[-1] == EOS)


def test_stochastic_beam_search_draws_differ_between_seeds_and_repeat_with_one():
    config = BeamSearchConfig(width=2, n_best=2, stochastic=True, max_tokens=3)

    def draws(seed):
        generator = torch.Generator().manual_seed(seed)
        return [[h.token_ids for h in beam_search(ToyModel(), PROMPT, config, generator=generator).completions]
                for _ in range(10)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_unseeded_stochastic_beam_search_draws_fresh_entropy():
    """Regression: without a generator every run seeded 0, so all runs drew the same beams (every
    other loop draws fresh OS entropy then). Twenty unseeded runs of ten searches each (width 1 is
    ancestral sampling over 3 tokens of the toy model): all equal has probability far below 1e-9."""
    config = BeamSearchConfig(width=1, stochastic=True, max_tokens=3)
    model = ToyModel()
    runs = {tuple(tuple(beam_search(model, PROMPT, config).completions[0].token_ids) for _ in range(10))
            for _ in range(20)}
    assert len(runs) > 1
    seeded = [[beam_search(model, PROMPT, config, generator=torch.Generator().manual_seed(5)).completions[0].token_ids
               for _ in range(3)] for _ in range(2)]
    assert seeded[0] == seeded[1]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_width_one_stochastic_beam_search_is_ancestral_sampling(temperature):
    samples = [hypotheses[0] for hypotheses in stochastic_runs(1, temperature)]
    assert_follows(samples, sequence_distribution(PROMPT, 2, tempered(temperature)))


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_width_two_is_two_draws_without_replacement(temperature):
    """Gumbel-top-2 over sequences: the first is drawn from p, the second from p without the first,

        P(second = s) = Σ_{t ≠ s} p_t · p_s / (1 − p_t).

    At temperature 0.3 this needs the keys built on the tempered log-probability of the whole
    prefix: with the untempered one (and a tempered last step) the second draw fails, p < 1e-20.
    """
    p = sequence_distribution(PROMPT, 2, tempered(temperature))
    runs = stochastic_runs(2, temperature, seed=1)
    assert all(first != second for first, second in runs)
    assert_follows((first for first, _ in runs), p)
    p_second = {s: sum(p[t] * p[s] / (1 - p[t]) for t in p if t != s) for s in p}
    assert sum(p_second.values()) == pytest.approx(1.0)
    assert_follows((second for _, second in runs), p_second)


# -------------------------------------------- stop rules and processors (decoding/rows.py)


def test_stop_token_ids_end_beams_as_an_eos_would():
    everything = BeamSearchConfig(width=85, n_best=85, length_penalty=0.6, max_tokens=3)
    as_eos = beam_search(ToyModel(eos_token_ids=(EOS, A)), PROMPT, everything).completions
    as_stop = beam_search(ToyModel(), PROMPT, replace(everything, stop_token_ids=[A])).completions
    assert [(h.token_ids, h.finish_reason) for h in as_stop] == \
           [(h.token_ids, h.finish_reason) for h in as_eos]
    assert [h.score for h in as_stop] == pytest.approx([h.score for h in as_eos], abs=1e-6)
    assert any(h.token_ids[-1] == A and h.finish_reason == "stop" for h in as_stop)


def test_a_stop_string_finishes_a_beam_and_is_cut_from_its_text():
    config = BeamSearchConfig(width=1, length_penalty=0.0, max_tokens=5, stop="ab")
    best = beam_search(ToyModel(), PROMPT, config).completions[0]
    assert best.token_ids == [A, A, B]  # the greedy path, ended where "ab" appears
    assert (best.text, best.finish_reason) == ("a", "stop")
    assert best.logprobs == pytest.approx(step_logprobs(PROMPT, [A, A, B]), abs=1e-5)


def test_ignore_eos_and_the_context_bound_beams():
    ignoring = beam_search(ToyModel(), [BOS, B], BeamSearchConfig(width=1, max_tokens=3, ignore_eos=True))
    best = ignoring.completions[0]
    assert best.token_ids[0] == EOS and len(best.token_ids) == 3
    assert best.finish_reason == "length"
    short = beam_search(ToyModel(max_context=4), [BOS, C], BeamSearchConfig(width=2, n_best=2, max_tokens=10))
    assert all(len(h.token_ids) <= 2 for h in short.completions)
    assert any(h.finish_reason == "length" for h in short.completions)
    with pytest.raises(ValueError, match="stop_token_ids entry 7 is out of range"):
        beam_search(ToyModel(), PROMPT, BeamSearchConfig(stop_token_ids=[7]))
    with pytest.raises(ValueError, match="stop="):
        BeamSearchConfig(stop=[""])


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_stateful_mask_follows_the_beams_and_ranking_is_brute_force_over_valid_sequences(alpha):
    """BanRepeats (each beam bans its own tokens) forked with the beams: a beam as wide as the
    space returns exactly the sequences without a repeated token, ranked by log p(y)."""
    from .ban_repeats import BanRepeats, no_repeats

    valid = [(score, logprob, s) for score, logprob, s in brute_force_ranking(PROMPT, 3, alpha) if no_repeats(s)]
    config = BeamSearchConfig(width=len(valid), n_best=len(valid), length_penalty=alpha, max_tokens=3)
    processor = BanRepeats()
    hypotheses = beam_search(ToyModel(), PROMPT, config, processors=[processor]).completions
    assert sorted(tuple(h.token_ids) for h in hypotheses) == sorted(s for _, _, s in valid)
    assert [h.score for h in hypotheses] == pytest.approx([score for score, _, _ in valid], abs=1e-5)
    assert processor.histories == [[]]


def test_processors_can_end_beams_and_must_be_masks():
    from metagen.sampling import LogitBias, bias_vector

    from .ban_repeats import EndAfter

    config = BeamSearchConfig(width=4, n_best=4, max_tokens=5, ignore_eos=True)
    hypotheses = beam_search(ToyModel(), PROMPT, config, processors=[EndAfter(stop_after=2)]).completions
    assert all(len(h.token_ids) == 2 and h.finish_reason == "stop" and h.complete for h in hypotheses)
    with pytest.raises(ValueError, match="processors as masks"):
        beam_search(ToyModel(), PROMPT, config, processors=[LogitBias(bias_vector({1: 2.0}, 5))])


def test_width_one_stochastic_beam_search_with_a_mask_is_masked_ancestral_sampling():
    from .ban_repeats import BanRepeats, distribution_without_repeats

    generator = torch.Generator().manual_seed(3)
    config = BeamSearchConfig(width=1, stochastic=True, max_tokens=2)
    samples = [tuple(beam_search(ToyModel(), PROMPT, config, generator=generator,
                                 processors=[BanRepeats()]).completions[0].token_ids) for _ in range(RUNS)]
    assert_follows(samples, distribution_without_repeats(PROMPT, 2))
