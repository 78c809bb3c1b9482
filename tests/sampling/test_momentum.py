"""Momentum decoding (Lan et al. 2022): loop depths and scores by hand and against a plain-Python
reference, the state following the KV cache, the toy model leaving a greedy loop, and the real
model repeating less than greedy decoding under `metagen generate`."""

from __future__ import annotations

import json
import random

import pytest
import torch

from metagen.sampling import MomentumState, SamplerChain, SamplingParams, loop_depths, momentum_scores

from .helpers import logits_of

NEG_INF = float("-inf")


def reference_depth(tokens: list[int], candidate: int, max_depth: int) -> int:
    """d(v) as the paper's code counts it: 0 for a token not in the text, else the longest
    m <= D whose m-gram (last m - 1 tokens, v) occurs in the text."""
    if candidate not in tokens:
        return 0
    grams = {tuple(tokens[i:i + m]) for m in range(1, max_depth + 1) for i in range(len(tokens) - m + 1)}
    return max(m for m in range(1, max_depth + 1)
               if m - 1 <= len(tokens) and tuple(tokens[len(tokens) - m + 1:] + [candidate]) in grams)


# ------------------------------------------------------------------ depths and scores by hand


@pytest.mark.parametrize(("history", "max_depth", "expected"), [
    ([1, 2, 3, 1, 2], 5, [0, 1, 1, 3, 0, 0]),  # 3 would repeat "1 2 3"; 1 and 2 were seen, not after "2"
    ([1, 2, 3, 1, 2], 2, [0, 1, 1, 2, 0, 0]),  # capped at D = 2
    ([1, 2, 3, 1, 2], 1, [0, 1, 1, 1, 0, 0]),  # D = 1: seen or not
    ([3, 3, 3], 5, [0, 0, 0, 3, 0, 0]),  # "3 3 3" again; "3 3 3 3" never occurred
    ([], 5, [0, 0, 0, 0, 0, 0]),
])
def test_depths_by_hand(history, max_depth, expected):
    assert loop_depths(torch.tensor([history], dtype=torch.long), max_depth, 6).tolist() == [expected]


def test_depths_skip_left_padding():
    padded = torch.tensor([[-1, -1, 1, 2, 3, 1, 2], [-1, -1, -1, -1, -1, 4, 4]])
    assert loop_depths(padded, 5, 6).tolist() == [[0, 1, 1, 3, 0, 0], [0, 0, 0, 0, 2, 0]]


def test_depths_match_the_reference_on_random_texts():
    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 14))]
        depth = rng.randrange(1, 6)
        got = loop_depths(torch.tensor([tokens], dtype=torch.long).reshape(1, -1), depth, 4)[0].tolist()
        assert got == [reference_depth(tokens, v, depth) for v in range(4)], (tokens, depth)


def test_scores_by_hand_for_depths_one_and_two():
    # text ... 1 2 3 1; p = (0.05, 0.3, 0.25, 0.35, 0.05): 3 has depth 1 (seen, never after "1"),
    # 2 depth 2 ("1 2" again), 1 depth 1, 0 and 4 are new; alpha = 0.2, k = 4 (token 4 left out)
    history = torch.tensor([[1, 2, 3, 1]])
    logits = logits_of([0.05, 0.3, 0.25, 0.35, 0.05]).unsqueeze(0)
    scores = momentum_scores(logits, history, max_depth=5, resistance=0.2, candidates=4)
    expected = [0.05, 0.3 - 0.2 * 1, 0.25 - 0.2 * 2, 0.35 - 0.2 * 1, NEG_INF]
    assert scores[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert int(scores.argmax()) == 3  # greedy's token still wins: 0.15 > 0.1 > 0.05


def test_a_token_that_closes_no_loop_keeps_its_probability():
    logits = logits_of([0.1, 0.6, 0.3]).unsqueeze(0)
    scores = momentum_scores(logits, torch.tensor([[0, 0]]), max_depth=5, resistance=0.5, candidates=3)
    assert scores[0].tolist() == pytest.approx([0.1 - 0.5 * 2, 0.6, 0.3], abs=1e-6)


def test_a_deep_loop_loses_to_a_new_candidate_and_banned_candidates_stay_out():
    history = torch.tensor([[2, 0, 1, 2, 0, 1, 2, 0]])  # greedy's 1 would walk "0 1 2 0 1" again: depth 5
    logits = torch.tensor([[-1.0, 3.0, NEG_INF, 1.0]])  # token 2 banned (a constraint, say)
    scores = momentum_scores(logits, history, max_depth=5, resistance=0.2, candidates=4)
    p = logits.softmax(-1)[0].tolist()
    assert scores[0].tolist() == pytest.approx([p[0] - 0.2 * 1, p[1] - 0.2 * 5, NEG_INF, p[3]], abs=1e-6)
    assert int(scores.argmax()) == 3


def test_input_untouched_and_shape_kept():
    logits = torch.randn(3, 7)
    before = logits.clone()
    state = MomentumState(torch.tensor([[1, 2], [3, 3], [-1, 4]]), max_depth=3)
    out = state.apply(logits)
    assert torch.equal(logits, before) and out.shape == (3, 7) and out.dtype == torch.float32


# ------------------------------------------------------------------ the state follows the rows


def _expected(state: MomentumState, rows: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    width = max(len(row) for row in rows)
    history = torch.tensor([[-1] * (width - len(row)) + row for row in rows], dtype=torch.long)
    return momentum_scores(logits, history, state.max_depth, state.resistance, state.candidates)


def test_accept_rollback_select_fork_concat_reset_match_recomputing():
    rng = random.Random(1)
    prompts = [[1, 2, 3], [4], [2, 2]]
    state = MomentumState.from_prompt(prompts, 3, max_depth=4, resistance=0.3, candidates=3, max_new_tokens=2)
    rows = [list(p) for p in prompts]
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    for step in range(12):  # more than the reserved room: the buffer grows
        tokens = [rng.randrange(6) if rng.random() > 0.2 else -1 for _ in rows]  # -1: row skipped
        state.accept(torch.tensor(tokens))
        for row, token in zip(rows, tokens):
            if token >= 0:
                row.append(token)
        assert torch.equal(state.apply(logits), _expected(state, rows, logits)), step
    state.rollback(torch.tensor([2, 0, 1]))
    rows[0], rows[2] = rows[0][:-2], rows[2][:-1]
    assert torch.equal(state.apply(logits), _expected(state, rows, logits))

    state.select(torch.tensor([2, 0, 0]))
    rows = [list(rows[2]), list(rows[0]), list(rows[0])]
    assert torch.equal(state.apply(logits), _expected(state, rows, logits))

    forked = state.fork(torch.tensor([1]))
    forked.accept(torch.tensor([5]))
    assert torch.equal(forked.apply(logits[:1]), _expected(forked, [rows[1] + [5]], logits[:1]))
    assert torch.equal(state.apply(logits), _expected(state, rows, logits))  # the original is unchanged

    joined = MomentumState.concat([forked, state])
    assert joined.batch_size == 4
    joined_logits = torch.cat([logits[:1], logits])
    assert torch.equal(joined.apply(joined_logits), _expected(joined, [rows[1] + [5], *rows], joined_logits))

    state.reset()
    assert torch.equal(state.apply(logits), _expected(state, [prompts[2], prompts[0], prompts[0]], logits))


def test_rollback_beyond_what_was_accepted_is_refused():
    state = MomentumState.from_prompt([1, 2], 1, max_depth=3)
    state.accept(torch.tensor([3]))
    with pytest.raises(ValueError, match="rollback of 2 tokens in row 0"):
        state.rollback(torch.tensor([2]))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_depth": 0}, "max_depth=0"),
    ({"max_depth": 3, "resistance": 0.0}, "resistance=0.0"),
    ({"max_depth": 3, "candidates": 0}, "candidates=0"),
])
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MomentumState(torch.tensor([[1]]), **kwargs)


# ------------------------------------------------------------------ SamplingParams and the chain


def test_params_refuse_sampling_and_orphan_settings_by_name():
    with pytest.raises(ValueError, match=r"momentum_ngram=5 cannot be combined with temperature=0.7"):
        SamplingParams(temperature=0.7, momentum_ngram=5)
    with pytest.raises(ValueError, match=r"momentum_resistance=0.5 applies with momentum_ngram only"):
        SamplingParams(temperature=0, momentum_resistance=0.5)
    with pytest.raises(ValueError, match=r"momentum_candidates=3 applies with momentum_ngram only"):
        SamplingParams(temperature=0, momentum_candidates=3)
    with pytest.raises(ValueError, match=r"momentum_ngram=-1 is out of range: must be an int >= 0"):
        SamplingParams(temperature=0, momentum_ngram=-1)
    with pytest.raises(ValueError, match=r"momentum_resistance=0 is out of range: must be in \(0, inf\)"):
        SamplingParams(temperature=0, momentum_ngram=5, momentum_resistance=0)
    with pytest.raises(ValueError, match=r"momentum_candidates=0 is out of range: must be an int >= 1"):
        SamplingParams(temperature=0, momentum_ngram=5, momentum_candidates=0)


def test_chain_runs_momentum_last_under_greedy_decoding():
    params = SamplingParams(temperature=0, momentum_ngram=4, momentum_resistance=0.3, momentum_candidates=2,
                            presence_penalty=0.5)
    chain = SamplerChain.from_params(params, batch_size=2, vocab_size=6, prompt_ids=[1, 2])
    assert chain.names == ("penalties", "momentum")
    momentum = chain.momentum
    assert (momentum.max_depth, momentum.resistance, momentum.candidates) == (4, 0.3, 2)
    assert SamplerChain.from_params(SamplingParams(temperature=0), 1, 6).momentum is None


# ------------------------------------------------------------------ leaving a loop


def _decode(model, prompt: list[int], params: SamplingParams) -> list[int]:
    from metagen.decoding import generate

    return generate(model, prompt, params).completions[0].token_ids


def test_the_toy_model_leaves_the_loop_plain_greedy_never_leaves(one_thread):
    from tests.decoding.toy_model import BOS, EOS, C, ToyModel, next_logits

    prompt = [BOS, C]  # after "c", "c" has p ~ 0.93 forever: greedy repeats it to max_tokens
    greedy = _decode(ToyModel(), prompt, SamplingParams(temperature=0, max_tokens=12))
    assert greedy == [C] * 12
    momentum = _decode(ToyModel(), prompt, SamplingParams(temperature=0, max_tokens=12, momentum_ngram=5))
    # written out: each step takes argmax of p - 0.2 d over all 5 tokens; d(c) climbs 1, 2, 3, 4, 5
    context, expected = list(prompt), []
    while len(expected) < 12 and (not expected or expected[-1] != EOS):
        probabilities = next_logits(context).softmax(-1).tolist()
        scores = [p - 0.2 * reference_depth(context, v, 5) for v, p in enumerate(probabilities)]
        expected.append(max(range(5), key=scores.__getitem__))
        context.append(expected[-1])
    assert momentum == expected
    assert momentum[:4] == [C] * 4 and momentum[-1] == EOS and len(momentum) < 12


# ------------------------------------------------------------------ the real model


def repeated_fraction(tokens: list[int], n: int) -> float:
    """rep-n: the share of the n-grams of `tokens` that repeat an earlier one (1 - distinct-n)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams)


@pytest.mark.slow
def test_generate_with_momentum_repeats_less_than_greedy(capsys):
    """SmolLM2-135M under greedy decoding cycles through the same bullet line; momentum decoding
    leaves it. Measured (128 tokens, CPU): rep-4 0.51 greedy vs 0.00 momentum, distinct-2 0.37 vs 0.91,
    at the same speed (152 vs 161 tokens/s in `generate`). Two model loads make it slow."""
    from metagen.cli import main

    def tokens(*flags: str) -> list[int]:
        argv = ["generate", "My favourite things are", "--no-chat", "--temperature", "0", "--max-tokens", "128",
                "--ignore-eos", "--json", *flags]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["tokens"]

    greedy = tokens()
    momentum = tokens("--momentum-ngram", "5")
    assert len(greedy) == len(momentum) == 128
    assert repeated_fraction(greedy, 4) > 0.4
    assert repeated_fraction(momentum, 4) < 0.1
    assert repeated_fraction(momentum, 2) < repeated_fraction(greedy, 2)
