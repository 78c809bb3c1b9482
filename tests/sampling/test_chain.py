from __future__ import annotations

import math

import pytest
import torch

from metagen.sampling import (
    SamplerChain,
    SamplingParams,
    StatelessProcessor,
    check_choosable,
    epsilon,
    eta,
    frequency_penalty,
    logit_bias,
    min_p,
    no_repeat_ngram,
    presence_penalty,
    repetition_penalty,
    temperature,
    top_k,
    top_p,
    typical,
)

from .helpers import DRAWS, assert_frequencies, logits_of

EVERYTHING = SamplingParams(
    logit_bias={0: 0.5},
    repetition_penalty=1.3,
    frequency_penalty=0.2,
    presence_penalty=0.1,
    no_repeat_ngram_size=2,
    temperature=0.7,
    top_k=6,
    top_p=0.95,
    min_p=0.01,
    typical_p=0.97,
    epsilon_cutoff=1e-4,
    eta_cutoff=1e-4,
)
ORDER = ("logit_bias", "penalties", "no_repeat_ngram", "temperature", "top_k", "top_p", "min_p",
         "typical", "epsilon", "eta")


def test_only_active_adapters_in_documented_order() -> None:
    assert SamplerChain.from_params(SamplingParams(), 1, 8).names == ()
    assert SamplerChain.from_params(EVERYTHING, 1, 8).names == ORDER
    assert SamplerChain.from_params(SamplingParams(top_p=0.5, temperature=2.0), 1, 8).names == (
        "temperature", "top_p")
    # top_k >= V keeps everything: left out.
    assert SamplerChain.from_params(SamplingParams(top_k=8), 1, 8).names == ()


def test_process_equals_the_composition_of_the_functions() -> None:
    prompt, vocab = [1, 2, 3, 1], 8
    chain = SamplerChain.from_params(EVERYTHING, 2, vocab, prompt)
    generated = [2, 5]
    for token in generated:
        chain.accept(torch.tensor([token, token]))
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0)) * 3
    before = logits.clone()
    history = prompt + generated
    expected = logit_bias(logits, {0: 0.5})
    expected = repetition_penalty(expected, torch.tensor([history] * 2), 1.3)
    expected = frequency_penalty(expected, torch.tensor([generated] * 2), 0.2)
    expected = presence_penalty(expected, torch.tensor([generated] * 2), 0.1)
    expected = no_repeat_ngram(expected, torch.tensor([history] * 2), 2)
    expected = temperature(expected, 0.7)
    expected = top_k(expected, 6)
    expected = top_p(expected, 0.95)
    expected = min_p(expected, 0.01)
    expected = typical(expected, 0.97)
    expected = epsilon(expected, 1e-4)
    expected = eta(expected, 1e-4)
    assert torch.allclose(chain.process(logits), expected, atol=1e-6)
    assert torch.equal(logits, before)


def test_empty_chain_returns_a_copy() -> None:
    chain = SamplerChain.from_params(SamplingParams(), 2, 4)
    logits = torch.randn(2, 4)
    out = chain.process(logits)
    assert torch.equal(out, logits) and out.data_ptr() != logits.data_ptr()
    assert chain.batch_size is None and not chain.stateful


def test_sampled_frequencies_of_the_chain() -> None:
    """Repetition 2 -> temperature 0.5 -> top_k 3 -> top_p 0.8, by hand.

    probs {0.05, 0.15, 0.2, 0.25, 0.35}; token 4 is in the prompt, ln 0.35 < 0 is doubled:
    weight 0.35^2 = 0.1225. top_k 3 keeps {0.15, 0.2, 0.25}; temperature 0.5 squares them:
    {0.0225, 0.04, 0.0625} / 0.125 = {0.18, 0.32, 0.5}; top_p 0.8 keeps {0.5, 0.32}
    -> {0.5, 0.32} / 0.82. (Temperature after top_p would have kept all three.)
    """
    params = SamplingParams(repetition_penalty=2.0, temperature=0.5, top_k=3, top_p=0.8)
    chain = SamplerChain.from_params(params, DRAWS, 5, prompt_ids=[4])
    logits = logits_of([0.05, 0.15, 0.2, 0.25, 0.35]).expand(DRAWS, 5)
    tokens = chain.next_tokens(logits, torch.Generator().manual_seed(0))
    assert_frequencies(tokens, [0, 0, 0.32 / 0.82, 0.5 / 0.82, 0])


def test_greedy_keeps_penalties_and_drops_the_rest() -> None:
    params = SamplingParams(temperature=0.0, top_p=0.1, typical_p=0.2, presence_penalty=2.0)
    chain = SamplerChain.from_params(params, 1, 3)
    assert chain.names == ("penalties",)
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    assert chain.next_tokens(logits).tolist() == [0]
    # Token 0 was generated: the presence penalty makes token 1 the argmax.
    assert chain.next_tokens(logits).tolist() == [1]


def test_update_feeds_the_penalties() -> None:
    chain = SamplerChain.from_params(SamplingParams(frequency_penalty=1.0), 2, 3)
    chain.accept(torch.tensor([2, 0]))
    chain.accept(torch.tensor([2, -1]))
    assert chain.process(torch.zeros(2, 3)).tolist() == [[0, 0, -2], [-1, 0, 0]]


def test_select_follows_a_cache_reorder() -> None:
    params = SamplingParams(presence_penalty=1.0, no_repeat_ngram_size=2, temperature=0.9)
    chain = SamplerChain.from_params(params, 2, 6, prompt_ids=[[1, 2, 1], [3, 4, 3]])
    chain.accept(torch.tensor([5, 0]))
    chain.select(torch.tensor([1, 1, 0]))
    assert chain.batch_size == 3
    out = chain.process(torch.zeros(3, 6))
    expected_row = {0: torch.tensor([-1.0, 0, 0, 0, 0, 0]), 2: torch.tensor([0.0, 0, 0, 0, 0, -1])}
    assert torch.equal(out[0], out[1]) and torch.equal(out[0] * 0.9, expected_row[0])
    assert torch.equal(out[2] * 0.9, expected_row[2])


def test_fork_is_independent() -> None:
    chain = SamplerChain.from_params(SamplingParams(presence_penalty=1.0), 2, 3)
    forked = chain.fork(torch.tensor([0, 0]))
    forked.accept(torch.tensor([1, 2]))
    assert chain.process(torch.zeros(2, 3)).eq(0).all()
    assert forked.process(torch.zeros(2, 3)).tolist() == [[0, -1, 0], [0, 0, -1]]
    assert forked.names == chain.names


def test_mirostat_chain() -> None:
    params = SamplingParams(mirostat_tau=1.5, mirostat_eta=0.1, temperature=1.0)
    chain = SamplerChain.from_params(params, DRAWS, 4)
    assert chain.names == ("mirostat",)
    assert chain.mirostat is not None
    chain.mirostat.mu.fill_(2.5)  # surprises 1, 2, 3, 3 bits: keeps the first two tokens
    tokens = chain.next_tokens(logits_of([0.5, 0.25, 0.125, 0.125]).expand(DRAWS, 4),
                               torch.Generator().manual_seed(1))
    assert_frequencies(tokens, [2 / 3, 1 / 3, 0, 0])
    surprise = torch.tensor([1.0, 2.0, 3.0, 3.0])[tokens]
    assert torch.allclose(chain.mirostat.mu, 2.5 - 0.1 * (surprise - 1.5))


def test_mirostat_follows_select() -> None:
    chain = SamplerChain.from_params(SamplingParams(mirostat_tau=2.0), 2, 4)
    chain.mirostat.mu.copy_(torch.tensor([1.0, 7.0]))
    chain.select(torch.tensor([1, 0, 1]))
    assert chain.mirostat.mu.tolist() == [7.0, 1.0, 7.0]
    out = chain.process(logits_of([0.5, 0.25, 0.125, 0.125]).expand(3, 4))
    assert torch.isfinite(out).sum(-1).tolist() == [4, 1, 4]


def test_logit_bias_out_of_vocab_raises_at_construction() -> None:
    with pytest.raises(ValueError, match="token id 10 is out of range for vocab size 10"):
        SamplerChain.from_params(SamplingParams(logit_bias={10: 1.0}), 1, 10)


def test_next_tokens_is_process_choose_update() -> None:
    params = SamplingParams(temperature=0.8, top_k=5, frequency_penalty=0.5)
    one = SamplerChain.from_params(params, 4, 20, prompt_ids=[1, 2])
    two = SamplerChain.from_params(params, 4, 20, prompt_ids=[1, 2])
    gen_one, gen_two = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for step in range(5):
        logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(step))
        tokens = two.choose(two.process(logits), gen_two)
        two.accept(tokens)
        assert torch.equal(one.next_tokens(logits, gen_one), tokens)


def test_seeded_runs_repeat() -> None:
    params = SamplingParams(temperature=1.2, top_p=0.9, seed=3)
    runs = []
    for _ in range(2):
        chain = SamplerChain.from_params(params, 3, 50)
        generator = params.make_generator()
        runs.append([chain.next_tokens(torch.randn(3, 50, generator=torch.Generator().manual_seed(i)),
                                       generator) for i in range(4)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_minus_inf_everywhere_raises() -> None:
    chain = SamplerChain.from_params(SamplingParams(top_p=0.5), 1, 3)
    with pytest.raises(ValueError, match="all -inf"):
        chain.next_tokens(torch.full((1, 3), -math.inf), torch.Generator())


NAN, INF = float("nan"), float("inf")
ONE_ADAPTER_EACH = {
    "logit_bias": SamplingParams(logit_bias={0: 0.5}),
    "penalties": SamplingParams(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1),
    "no_repeat_ngram": SamplingParams(no_repeat_ngram_size=2),
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(top_k=2),
    "top_p": SamplingParams(top_p=0.9),
    "min_p": SamplingParams(min_p=0.1),
    "typical": SamplingParams(typical_p=0.9),
    "epsilon": SamplingParams(epsilon_cutoff=0.01),
    "eta": SamplingParams(eta_cutoff=0.01),
    "mirostat": SamplingParams(mirostat_tau=3.0),
    "greedy": SamplingParams(temperature=0.0),
    "everything": EVERYTHING,
}


@pytest.mark.parametrize("params", ONE_ADAPTER_EACH.values(), ids=list(ONE_ADAPTER_EACH))
@pytest.mark.parametrize(("bad", "reason"), [(NAN, "NaN"), (INF, r"\+inf")], ids=["nan", "inf"])
def test_nan_and_inf_are_reported_as_such_whatever_the_adapters(params, bad, reason) -> None:
    """Regression: with top_k a NaN became -inf and a token was drawn; through top_p, min_p, ...
    and mirostat the error blamed "every token was removed"."""
    chain = SamplerChain.from_params(params, 2, 8, prompt_ids=[1, 2, 1])
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    logits[1, 3] = bad
    message = rf"row \(1,\) token 3 is {reason}"
    with pytest.raises(ValueError, match=message):
        chain.process(logits)
    with pytest.raises(ValueError, match=message):
        chain.next_tokens(logits, torch.Generator().manual_seed(0))


def test_nan_is_reported_before_n_gram_blocking_bans_its_token() -> None:
    # After [1, 2, 1], blocking bans token 2; the NaN there is still the model's fault.
    chain = SamplerChain.from_params(SamplingParams(no_repeat_ngram_size=2), 1, 5, prompt_ids=[1, 2, 1])
    logits = torch.zeros(1, 5)
    logits[0, 2] = NAN
    with pytest.raises(ValueError, match=r"token 2 is NaN"):
        chain.process(logits)


def test_minus_inf_marks_removed_tokens_and_an_all_minus_inf_row_is_refused() -> None:
    chain = SamplerChain.from_params(SamplingParams(top_k=2), 2, 4)
    logits = torch.tensor([[0.0, -INF, 1.0, -INF], [0.5, 0.0, -INF, 2.0]])
    processed = chain.process(logits)
    assert processed[0, 1] == -INF and processed[1, 2] == -INF
    logits[1] = -INF
    with pytest.raises(ValueError, match=r"row \(1,\) is all -inf"):
        chain.process(logits)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_the_processors_empty_names_them_and_their_fields(temperature) -> None:
    """Regression: a mask allowing only token 1 after a prompt holding token 1, with
    no_repeat_ngram_size=1, left nothing; the error said only "every token was removed"."""
    only_one = StatelessProcessor("structured:choice", lambda z: torch.where(
        torch.arange(z.shape[-1]) == 1, z, torch.full_like(z, -INF)), argmax_invariant=False)
    params = SamplingParams(temperature=temperature, no_repeat_ngram_size=1)
    chain = SamplerChain.from_params(params, 1, 5, prompt_ids=[1], masks=[only_one])
    with pytest.raises(ValueError, match=r"row \(0,\) is all -inf \(every token was removed\) by the processors "
                                         r"structured:choice -> no_repeat_ngram: the settings structured_outputs, "
                                         r"no_repeat_ngram_size leave no token"):
        chain.next_tokens(torch.zeros(1, 5), torch.Generator().manual_seed(0))


def test_an_emptied_row_is_a_typed_error_carrying_the_row_and_the_processors() -> None:
    """The chain names the processors from the error's fields (`EmptiedRowError.row`), not by
    matching the text of check_choosable's message; a row emptied before any processor says so
    without naming one."""
    from metagen.sampling import EmptiedRowError

    only_one = StatelessProcessor("structured:choice", lambda z: torch.where(
        torch.arange(z.shape[-1]) == 1, z, torch.full_like(z, -INF)), argmax_invariant=False)
    chain = SamplerChain.from_params(SamplingParams(no_repeat_ngram_size=1), 2, 5, prompt_ids=[1], masks=[only_one])
    logits = torch.zeros(2, 5)
    with pytest.raises(EmptiedRowError) as caught:
        chain.next_tokens(logits, torch.Generator().manual_seed(0))
    assert caught.value.row == (0,) and caught.value.processors == ("structured:choice", "no_repeat_ngram")
    with pytest.raises(EmptiedRowError) as caught:
        check_choosable(torch.tensor([[0.0, 1.0], [-INF, -INF]]))
    assert caught.value.row == (1,) and caught.value.processors == ()
    assert "by the processors" not in str(caught.value)


def test_a_step_checks_its_logits_once(monkeypatch):
    """Regression: a step checked the whole (B, V) logits for NaN / +inf in `process` and again in
    the choice (and the model a third time), each a reduction and a host synchronisation. The one
    full check is `process`'s; the choice looks at the B values it chose."""
    import importlib

    chain_module = importlib.import_module("metagen.sampling.chain")
    sample_module = importlib.import_module("metagen.sampling.sample")  # `metagen.sampling.sample` is the function

    calls = []
    original = sample_module.check_choosable

    def counted(logits):
        calls.append(logits.shape)
        return original(logits)

    monkeypatch.setattr(chain_module, "check_choosable", counted)
    monkeypatch.setattr(sample_module, "check_choosable", counted)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for params in (SamplingParams(temperature=0.0), SamplingParams(top_p=0.9, seed=1)):
        chain = SamplerChain.from_params(params, 3, 50)
        calls.clear()
        chain.next_tokens(logits, params.make_generator())
        assert calls == [torch.Size([3, 50])]
