"""The sampling loop on the enumerable toy model: exact paths, distributions and log-probs."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import GenerationResult, generate, generate_batch, stream
from metagen.sampling import SamplingParams

from .helpers import assert_follows
from .toy_model import (
    BOS,
    EOS,
    A,
    B,
    C,
    ToyModel,
    next_logits,
    sequence_distribution,
    step_logprobs,
    top_k_temperature,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS]


def argmax_path(prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding written out: the argmax token of each step until EOS or max_tokens."""
    context, path = list(prompt), []
    while len(path) < max_tokens:
        token = int(torch.argmax(next_logits(context)))
        path.append(token)
        context.append(token)
        if token == EOS:
            break
    return path


def text_of(tokens: list[int]) -> str:
    return "".join("abc"[t - 1] for t in tokens if t in (A, B, C))


# ------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("prompt", [[BOS], [BOS, A], [BOS, C, A], [BOS, A, A, A]])
@pytest.mark.parametrize("max_tokens", [1, 3, 6])
def test_greedy_is_the_argmax_path(prompt, max_tokens):
    completion = generate(ToyModel(), prompt, SamplingParams(temperature=0, max_tokens=max_tokens)).completions[0]
    path = argmax_path(prompt, max_tokens)
    assert completion.token_ids == path
    assert completion.text == text_of(path)
    if path[-1] == EOS:
        assert (completion.finish_reason, completion.stop_reason) == ("stop", EOS)
    else:
        assert (completion.finish_reason, completion.stop_reason) == ("length", None)


def test_greedy_path_of_the_toy_is_known():
    # Hand-checked against the table: a (0.45) > b (0.33); after a, a (0.26) > b (0.24) > EOS.
    assert argmax_path([BOS], 3) == [A, A, B]
    # After "b" EOS has probability 0.78: greedy stops at once.
    completion = generate(ToyModel(), [BOS, B], SamplingParams(temperature=0)).completions[0]
    assert completion.token_ids == [EOS]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == ("", "stop", EOS)


# ---------------------------------------------------------------------------- distributions

SAMPLED_SETTINGS = [
    ({}, None),
    ({"temperature": 1.6}, lambda z: z / 1.6),
    ({"top_k": 2, "temperature": 0.7}, top_k_temperature(2, 0.7)),
    ({"top_k": 3}, top_k_temperature(3, 1.0)),
]


@pytest.mark.parametrize(("settings", "adapt"), SAMPLED_SETTINGS)
def test_sampled_sequences_follow_the_enumerated_joint_distribution(settings, adapt):
    draws = 4000
    model = ToyModel()
    params = SamplingParams(n=draws, max_tokens=2, seed=1234, **settings)
    result = generate(model, PROMPT, params)
    assert len(result.completions) == draws
    expected = sequence_distribution(PROMPT, 2, adapt)
    assert_follows((tuple(c.token_ids) for c in result.completions), expected)
    # One prefill of the prompt for all n rows; then one batched step for the rows still going.
    assert model.calls[0] == [len(PROMPT)]
    still_going = sum(1 for c in result.completions if len(c.token_ids) == 2)
    assert model.calls[1:] == [[1] * still_going]
    assert result.cost.model_calls == 2


def test_top_k_never_samples_outside_the_kept_tokens():
    params = SamplingParams(n=500, max_tokens=3, seed=5, top_k=2)
    allowed = sequence_distribution(PROMPT, 3, top_k_temperature(2, 1.0))
    for completion in generate(ToyModel(), PROMPT, params).completions:
        assert allowed[tuple(completion.token_ids)] > 0


# --------------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize(("settings", "adapt"), SAMPLED_SETTINGS)
def test_logprobs_are_the_model_log_softmax_and_sampling_logprobs_the_adapted_one(settings, adapt):
    params = SamplingParams(n=64, max_tokens=4, seed=7, **settings)
    result = generate(ToyModel(), [BOS, C], params)
    for completion in result.completions:
        tokens = completion.token_ids
        assert len(completion.logprobs) == len(completion.sampling_logprobs) == len(tokens)
        model_logprobs = step_logprobs([BOS, C], tokens)
        assert completion.logprobs == pytest.approx(model_logprobs, abs=1e-5)
        assert completion.cumulative_logprob == pytest.approx(sum(model_logprobs), abs=1e-5)
        assert completion.sampling_logprobs == pytest.approx(step_logprobs([BOS, C], tokens, adapt), abs=1e-5)
    if adapt is not None:  # the two differ whenever the distribution was adapted
        first = result.completions[0]
        assert first.logprobs != pytest.approx(first.sampling_logprobs, abs=1e-3)


def test_top_logprobs_are_the_models_three_best_tokens():
    params = SamplingParams(n=8, max_tokens=3, seed=3, logprobs=3)
    for completion in generate(ToyModel(), PROMPT, params).completions:
        assert len(completion.top_logprobs) == len(completion.token_ids)
        for i, top in enumerate(completion.top_logprobs):
            logprobs = torch.log_softmax(next_logits(PROMPT + completion.token_ids[:i]).double(), dim=-1)
            best = torch.topk(logprobs, 3)
            assert list(top) == best.indices.tolist()  # ids, most likely first
            assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-5)


def test_without_logprobs_there_are_no_top_logprobs():
    completion = generate(ToyModel(), PROMPT, SamplingParams(max_tokens=2, seed=0)).completions[0]
    assert completion.top_logprobs is None


# ----------------------------------------------------------------------------- stopping


def test_max_tokens_ends_with_length():
    completion = generate(ToyModel(), [BOS, C], SamplingParams(temperature=0, max_tokens=4)).completions[0]
    assert completion.token_ids == [C, C, C, C]  # "c" follows "c" with p ≈ 0.94
    assert (completion.text, completion.finish_reason, completion.stop_reason) == ("cccc", "length", None)


def test_stop_token_id_ends_the_row_and_adds_no_text():
    params = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[B])
    completion = generate(ToyModel(), PROMPT, params).completions[0]
    assert completion.token_ids == [A, A, B]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == ("aa", "stop", B)


def test_ignore_eos_keeps_going():
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    completion = generate(ToyModel(), [BOS, B], params).completions[0]
    assert completion.token_ids[0] == EOS
    assert len(completion.token_ids) == 3
    assert completion.finish_reason == "length"


@pytest.mark.parametrize(
    ("stop", "text", "matched"),
    [
        ("ab", "a", "ab"),  # spans two tokens: "a" is held back until "b" completes it
        (["zz", "b"], "aa", "b"),
        (["ab", "aab"], "", "aab"),  # both end at the last "b": the one starting first wins
        (["aab", "ab"], "", "aab"),
    ],
)
def test_stop_string_cuts_the_text_before_it(stop, text, matched):
    params = SamplingParams(temperature=0, max_tokens=3, stop=stop)
    completion = generate(ToyModel(), PROMPT, params).completions[0]
    assert completion.token_ids == [A, A, B]
    assert completion.text == text
    assert (completion.finish_reason, completion.stop_reason) == ("stop", matched)


def test_text_held_back_for_a_possible_stop_string_is_released_at_the_end():
    params = SamplingParams(temperature=0, max_tokens=3, stop="bz")
    completion = generate(ToyModel(), PROMPT, params).completions[0]
    assert completion.text == "aab"  # the final "b" could have started "bz"
    assert (completion.finish_reason, completion.stop_reason) == ("length", None)


def test_the_context_length_bounds_generation():
    model = ToyModel(max_context=4)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    completion = generate(model, [BOS, C], params).completions[0]
    assert completion.token_ids == [C, C]
    assert completion.finish_reason == "length"
    with pytest.raises(ValueError, match="context is 4"):
        generate(model, [BOS, C, C, C], params)


def test_empty_prompt_raises():
    for prompt in ("", []):
        with pytest.raises(ValueError, match="empty"):
            generate(ToyModel(), prompt, SamplingParams(max_tokens=1))


def test_text_prompt_is_encoded_with_the_tokenizer():
    model = ToyModel()
    result = generate(model, "ab", SamplingParams(temperature=0, max_tokens=2))
    assert result.prompt_token_ids == [BOS, A, B]
    assert model.calls[0] == [3]


# ------------------------------------------------------------------------------ batching


def test_the_loop_fills_its_cost_as_it_spends_it():
    """`generate` alone (no Generator around it) returns its Cost: the prompt computed once and
    reused by the n − 1 forked rows, one model call per forward, the FLOPs of every fed token at
    its position, one target step per row and forward."""
    model = ToyModel()
    n = 40
    result = generate(model, PROMPT, SamplingParams(n=n, max_tokens=5, seed=11))
    cost, length = result.cost, len(PROMPT)
    generated = sum(len(c.token_ids) for c in result.completions)
    assert cost.model_calls == len(model.calls)
    assert (cost.prompt_tokens_computed, cost.prompt_tokens_reused) == (length, length * (n - 1))
    assert cost.generated_tokens == cost.target_steps == generated
    by_hand = sum(model.flops_per_token(i + 1) for i in range(length))
    by_hand += sum(len(call) * model.flops_per_token(length + step) for step, call in enumerate(model.calls[1:], 1))
    assert cost.flops == pytest.approx(by_hand, rel=1e-12)
    assert cost.wall_seconds > 0


def test_finished_rows_leave_the_batch_and_keep_their_own_history():
    model = ToyModel()
    params = SamplingParams(n=300, max_tokens=5, seed=11)
    result = generate(model, PROMPT, params)
    lengths = [len(c.token_ids) for c in result.completions]
    assert len(set(lengths)) > 2  # rows really did stop at different steps
    # Step s feeds exactly the rows that have more than s tokens.
    assert model.calls[0] == [1]
    for step, call in enumerate(model.calls[1:], start=1):
        assert call == [1] * sum(1 for n in lengths if n > step)
    assert result.cost.model_calls == len(model.calls) == max(lengths)
    # Each row's log-probs are those of its own history (the toy's logits depend on the last two
    # tokens, so a row given another row's cache after a select would not match).
    for completion in result.completions:
        assert completion.logprobs == pytest.approx(step_logprobs(PROMPT, completion.token_ids), abs=1e-5)
        ended_by_eos = completion.token_ids[-1] == EOS
        assert EOS not in completion.token_ids[:-1]
        assert completion.finish_reason == ("stop" if ended_by_eos else "length")
        assert len(completion.token_ids) == 5 or ended_by_eos


def test_stream_events_concatenate_to_the_completions():
    params = SamplingParams(n=6, max_tokens=6, seed=2, stop="ca")
    result = GenerationResult([], [])
    pieces = ["" for _ in range(6)]
    finished = [0] * 6
    for event in stream(ToyModel(), PROMPT, params, result=result):
        assert finished[event.index] == 0, "no event after a completion's last one"
        pieces[event.index] += event.text
        if event.finish_reason is not None:
            finished[event.index] += 1
            assert event.finish_reason == result.completions[event.index].finish_reason
    assert finished == [1] * 6
    assert pieces == [c.text for c in result.completions]
    again = generate(ToyModel(), PROMPT, params)
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in result.completions]


# --------------------------------------------------------------------------- randomness


def test_same_seed_same_tokens_different_seed_different_tokens():
    def tokens(**kwargs):
        return [c.token_ids for c in generate(ToyModel(), PROMPT, SamplingParams(n=20, max_tokens=4, **kwargs)).completions]

    assert tokens(seed=1) == tokens(seed=1)
    assert tokens(seed=1) != tokens(seed=2)
    explicit = generate(ToyModel(), PROMPT, SamplingParams(n=20, max_tokens=4, seed=99),
                        generator=torch.Generator().manual_seed(1))
    assert [c.token_ids for c in explicit.completions] == tokens(seed=1)  # the generator wins


def test_unseeded_generation_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    first = generate(ToyModel(), PROMPT, SamplingParams(n=30, max_tokens=4))
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.random.set_rng_state(state)
    second = generate(ToyModel(), PROMPT, SamplingParams(n=30, max_tokens=4))
    # Fresh entropy: resetting torch's global seed does not replay the draws.
    assert [c.token_ids for c in first.completions] != [c.token_ids for c in second.completions]


def test_generate_batch_shares_one_generator_across_prompts():
    params = SamplingParams(n=10, max_tokens=3, seed=4)
    prompts = [[BOS], [BOS, A], "c"]
    batch = generate_batch(ToyModel(), prompts, params)
    generator = torch.Generator().manual_seed(4)
    one_by_one = [generate(ToyModel(), p, params, generator=generator) for p in prompts]
    assert [[c.token_ids for c in r.completions] for r in batch] == [
        [c.token_ids for c in r.completions] for r in one_by_one
    ]


# ------------------------------------------------------------------ stateful processors


def test_a_stateful_processor_follows_each_row_through_the_fork_and_the_shrinking_batch():
    """BanRepeats (each row bans the tokens it generated) is given with one row after the prompt,
    forked into n rows, and dropped rows leave it with `select`: the sequences follow the
    enumerated law with the bans exactly (a row given another row's history would not)."""
    from .ban_repeats import BanRepeats, distribution_without_repeats

    given = BanRepeats()
    result = generate(ToyModel(), PROMPT, SamplingParams(n=4000, max_tokens=3, seed=21), processors=[given])
    assert_follows((tuple(c.token_ids) for c in result.completions), distribution_without_repeats(PROMPT, 3))
    assert given.histories == [[]]  # the caller's processor is not changed
    assert "select" in given.events  # rows did leave the batch


def test_greedy_with_a_stateful_processor_is_the_argmax_path_with_bans():
    from .ban_repeats import BanRepeats

    context, path = [BOS, C], []
    while len(path) < 4:  # "c c c c" without bans; each generated token is banned afterwards
        logits = next_logits(context)
        logits[path] = float("-inf")
        path.append(int(torch.argmax(logits)))
        context.append(path[-1])
        if path[-1] == EOS:
            break
    completion = generate(ToyModel(), [BOS, C], SamplingParams(temperature=0, max_tokens=4),
                          processors=[BanRepeats()]).completions[0]
    assert completion.token_ids == path and len(set(path)) == len(path)


def test_processors_decide_where_rows_end():
    from .ban_repeats import EndAfter

    ended = generate(ToyModel(), PROMPT, SamplingParams(n=50, max_tokens=6, seed=3, ignore_eos=True),
                     processors=[EndAfter(stop_after=2)])
    assert all(len(c.token_ids) == 2 and (c.finish_reason, c.complete) == ("stop", True) for c in ended.completions)
    cut = generate(ToyModel(), PROMPT, SamplingParams(n=50, max_tokens=3, seed=3), processors=[EndAfter(min_tokens=3)])
    for completion in cut.completions:
        assert completion.complete == (len(completion.token_ids) >= 3)
    assert any(c.complete is False for c in cut.completions)  # an early EOS the processor did not accept
    plain = generate(ToyModel(), PROMPT, SamplingParams(max_tokens=2, seed=3))
    assert plain.completions[0].complete is None
