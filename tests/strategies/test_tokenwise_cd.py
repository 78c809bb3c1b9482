"""Tokenwise controlled decoding samples p·exp(λV)/Z over the top-k candidates (toy model)."""

import math

import pytest
import torch
from scipy.stats import chisquare

from metagen.sampling import SamplingParams
from metagen.scoring.process_reward import FunctionValue
from metagen.strategies.tokenwise_cd import TokenwiseCDConfig, tilted_choice, tokenwise_cd
from tests.decoding.toy_model import A, B, BOS, C, EOS, VOCAB, ToyModel, next_logits

TOKEN_VALUE = {EOS: 0.1, A: 0.2, B: 0.9, C: 0.6, BOS: 0.0}


def last_token_value(prompt, continuation):
    return TOKEN_VALUE[continuation[-1]]


def expected(context, top_k, strength, temperature=1.0, banned=()):
    logits = next_logits(context).double() / temperature
    logits[list(banned)] = float("-inf")
    logp = torch.log_softmax(logits, dim=-1)
    keep = torch.topk(logp, top_k).indices.tolist()
    weights = [math.exp(logp[z] + strength * TOKEN_VALUE[z]) if z in keep else 0.0 for z in range(VOCAB)]
    total = sum(weights)
    return [w / total for w in weights]


@pytest.mark.parametrize("top_k,strength,temperature", [(5, 2.0, 1.0), (3, 3.0, 1.0), (2, -1.0, 0.7)])
def test_first_token_follows_the_tilted_distribution(top_k, strength, temperature, one_thread):
    n = 3000
    config = TokenwiseCDConfig(n=n, top_k=top_k, strength=strength,
                               params=SamplingParams(temperature=temperature, max_tokens=1))
    result = tokenwise_cd(ToyModel(), [BOS], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(7))
    counts = [0] * VOCAB
    for candidate in result.completions:
        counts[candidate.token_ids[0]] += 1
    probs = expected([BOS], top_k, strength, temperature)
    support = [z for z in range(VOCAB) if probs[z] > 0]
    assert all(counts[z] == 0 for z in range(VOCAB) if probs[z] == 0)
    observed = [counts[z] for z in support]
    assert chisquare(observed, [n * probs[z] for z in support]).pvalue > 1e-3


def test_second_token_uses_the_chosen_rows_context(one_thread):
    """Tokens after the first come from the chosen candidate's own cache row."""
    n = 3000
    config = TokenwiseCDConfig(n=n, top_k=5, strength=1.5, params=SamplingParams(temperature=1.0, max_tokens=2))
    result = tokenwise_cd(ToyModel(), [BOS], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(3))
    firsts = [c for c in result.completions if c.token_ids[0] == A]  # continue after "a"
    counts = [0] * VOCAB
    for candidate in firsts:
        counts[candidate.token_ids[1]] += 1
    probs = expected([BOS, A], 5, 1.5)
    assert chisquare(counts, [len(firsts) * p for p in probs]).pvalue > 1e-3


def test_zero_strength_is_top_k_sampling_and_cost_counts_k_rows(one_thread):
    model = ToyModel()
    config = TokenwiseCDConfig(n=4, top_k=3, strength=0.0, params=SamplingParams(temperature=1.0, max_tokens=3))
    result = tokenwise_cd(model, [BOS], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(0))
    assert model.calls[0] == [1]
    assert all(set(call) == {1} and len(call) % 3 == 0 for call in model.calls[1:])  # k rows per open row
    assert result.cost.generated_tokens == 3 * sum(len(c.token_ids) for c in result.completions)
    assert result.cost.model_calls == len(model.calls)
    for candidate in result.completions:
        assert candidate.finish_reason in ("stop", "length")
        assert len(candidate.logprobs) == len(candidate.token_ids)


def test_tilted_choice_exact_weights():
    logprobs = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    values = torch.tensor([[0.0, 1.0, 0.5]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([tilted_choice(logprobs, values, 2.0, generator) for _ in range(20000)]).flatten()
    weights = torch.tensor([0.5, 0.3 * math.e**2, 0.2 * math.e])
    frequencies = torch.bincount(draws, minlength=3).double() / draws.numel()
    assert torch.allclose(frequencies, (weights / weights.sum()).double(), atol=0.015)


def test_errors():
    with pytest.raises(ValueError, match="top_k=0"):
        TokenwiseCDConfig(top_k=0)


def test_candidates_reuse_their_rows_prefix(one_thread):
    config = TokenwiseCDConfig(n=1, top_k=2, strength=0.0, params=SamplingParams(temperature=1.0, max_tokens=2,
                                                                                  ignore_eos=True))
    result = tokenwise_cd(ToyModel(), [BOS], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(0))
    assert result.cost.prompt_tokens_computed == 1
    assert result.cost.prompt_tokens_reused == 2 * 1 + 2 * 2  # k × (prompt) then k × (prompt + 1 token)


def test_a_stateful_processor_follows_the_kept_candidate(one_thread):
    """BanRepeats (each row bans the tokens it generated): after "a" the second token is drawn
    from the tilted top-k of p with "a" banned — the kept candidate's state, not its siblings'."""
    from tests.decoding.ban_repeats import BanRepeats, no_repeats

    n = 3000
    config = TokenwiseCDConfig(n=n, top_k=4, strength=1.5, params=SamplingParams(temperature=1.0, max_tokens=3))
    result = tokenwise_cd(ToyModel(), [BOS], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(4), processors=[BanRepeats()])
    assert all(no_repeats(c.token_ids) for c in result.completions)
    firsts = [c for c in result.completions if c.token_ids[0] == A]
    counts = [0] * VOCAB
    for candidate in firsts:
        counts[candidate.token_ids[1]] += 1
    probs = expected([BOS, A], 4, 1.5, banned=[A])
    assert counts[A] == 0
    support = [z for z in range(VOCAB) if probs[z] > 0]
    assert chisquare([counts[z] for z in support], [len(firsts) * probs[z] for z in support]).pvalue > 1e-3


def test_penalties_are_honoured_per_row(one_thread):
    """top_k = 1: each token is the argmax of p, here the model's logits minus a presence penalty
    of 2 on the tokens the row generated (per-row state, formerly refused)."""
    context, path = [BOS, A], []
    for _ in range(5):
        logits = next_logits(context)
        logits[sorted(set(path))] -= 2.0
        path.append(int(torch.argmax(logits)))
        context.append(path[-1])
    assert len(set(path)) > 2  # the penalty moved the argmax to fresh tokens
    config = TokenwiseCDConfig(n=2, top_k=1, strength=1.0, params=SamplingParams(
        temperature=1.0, max_tokens=5, presence_penalty=2.0, ignore_eos=True))
    result = tokenwise_cd(ToyModel(), [BOS, A], FunctionValue(last_token_value), config,
                          rng=torch.Generator().manual_seed(0))
    assert [c.token_ids for c in result.completions] == [path, path]


def test_stop_strings_do_not_decode_the_whole_row_per_token(one_thread):
    """Regression: each token decoded the whole row to look for stop strings, O(T²)."""
    from tests.decoding.test_rows import CountingTokenizer

    model = ToyModel(max_context=1024)
    model.tokenizer = CountingTokenizer()
    config = TokenwiseCDConfig(n=1, top_k=2, strength=0.0, params=SamplingParams(
        temperature=1.0, max_tokens=400, stop=["zz"], ignore_eos=True))
    result = tokenwise_cd(model, [BOS], FunctionValue(last_token_value), config, rng=torch.Generator().manual_seed(0))
    assert len(result.chosen.token_ids) == 400
    assert model.tokenizer.decoded_ids < 20 * 400  # re-decoding the row each token reads ~80000 ids


def test_refuses_a_batch_of_candidates_that_cannot_fit(monkeypatch):
    """Each forward runs n·top_k candidate rows: the memory check counts them, naming the options.
    A toy row holds 6 copies of 5 float32 logits (120 bytes, no cache): 1000 bytes fit 8 rows."""
    monkeypatch.setattr("metagen.decoding.memory.available_memory", lambda: 1000)
    value = FunctionValue(last_token_value)
    params = SamplingParams(temperature=1.0, max_tokens=2)
    with pytest.raises(ValueError, match=r"n·top_k=20 is too large .* use n·top_k <= 8"):
        tokenwise_cd(ToyModel(), [BOS], value, TokenwiseCDConfig(n=4, top_k=5, params=params))
    result = tokenwise_cd(ToyModel(), [BOS], value, TokenwiseCDConfig(n=2, top_k=4, params=params),
                          rng=torch.Generator().manual_seed(0))  # 8 rows fit
    assert len(result.completions) == 2


def test_argmax_takes_the_mode_of_the_tilt():
    """log p + λV = [log .5, log .3 + 2, log .2 + 1] → the second; λ = 0 → the first (p's mode)."""
    logprobs = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]))
    values = torch.tensor([[0.0, 1.0, 0.5], [1.0, 0.0, 0.0]])
    assert tilted_choice(logprobs, values, 2.0, None, argmax=True).tolist() == [1, 0]
    assert tilted_choice(logprobs, values, 0.0, None, argmax=True).tolist() == [0, 2]
    with pytest.raises(ValueError, match="token_choice='mode' is not known; choose from sample, argmax"):
        TokenwiseCDConfig(token_choice="mode")
