"""The sampling loop on the real embedded SmolLM2-135M-Instruct (short generations)."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import GenerationResult, generate, stream
from metagen.models.kernel_backend import resolve_backend
from metagen.sampling import SamplingParams

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


# The answer's first token is a near-tie on this model (the top two logits ~0.2 apart): torch's
# int4 kernels (METAGEN_KERNELS=torch, bf16 activations) pick "L'Étoile, la Marseillaise, ..."
# instead of naming Paris, so the tests built on the answer's words need the default kernels.
NAMES_PARIS = pytest.mark.skipif(resolve_backend() == "torch", reason="the torch kernels' greedy answer "
                                 "takes the other side of a near-tie and does not name Paris")


@pytest.fixture(scope="module")
def answer(model):
    """Greedy answer to QUESTION in the chat template, with the top-3 log-probs of each token."""
    return generate(model, QUESTION, SamplingParams(temperature=0, max_tokens=24, logprobs=3))


@NAMES_PARIS
def test_greedy_chat_answer_names_paris_and_ends_on_eos(model, answer):
    completion = answer.completions[0]
    assert "Paris" in completion.text
    eos = completion.token_ids[-1]
    assert eos in model.eos_token_ids
    assert (completion.finish_reason, completion.stop_reason) == ("stop", eos)
    assert all(t not in model.eos_token_ids for t in completion.token_ids[:-1])
    # EOS is reported as a token but adds no text.
    assert completion.text == model.tokenizer.decode(completion.token_ids[:-1])
    assert model.tokenizer.decode([eos]) not in completion.text
    assert answer.prompt_token_ids == model.tokenizer.encode_chat([{"role": "user", "content": QUESTION}])


def test_top_logprobs_are_the_models_three_best(model, answer):
    completion = answer.completions[0]
    assert len(completion.top_logprobs) == len(completion.logprobs) == len(completion.token_ids)
    for token, logprob, top in zip(completion.token_ids, completion.logprobs, completion.top_logprobs):
        assert len(top) == 3
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        assert next(iter(top)) == token  # greedy picks the most likely token
        assert logprob == pytest.approx(values[0], abs=1e-6)
        assert all(v <= 0 for v in values) and sum(torch.tensor(values).exp()) <= 1 + 1e-6
    # The first step's numbers are the prefill's log-softmax.
    _, out = model.prefill(answer.prompt_token_ids)
    best = torch.topk(torch.log_softmax(out.logits[0], dim=-1), 3)
    assert list(completion.top_logprobs[0]) == best.indices.tolist()
    assert list(completion.top_logprobs[0].values()) == pytest.approx(best.values.tolist(), abs=1e-4)


@NAMES_PARIS
def test_stop_string_ends_the_text_before_it(model, answer):
    full = answer.completions[0]
    params = SamplingParams(temperature=0, max_tokens=24, stop=["Paris", "Berlin"])
    completion = generate(model, QUESTION, params).completions[0]
    assert completion.text == full.text[: full.text.index("Paris")]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "Paris")
    assert completion.token_ids == full.token_ids[: len(completion.token_ids)]
    assert len(completion.token_ids) < len(full.token_ids)  # generation stopped there


def test_max_tokens_ends_with_length_after_exactly_that_many_tokens(model):
    result = generate(model, "Once upon a time", SamplingParams(temperature=0, max_tokens=5), chat=False)
    completion = result.completions[0]
    assert len(completion.token_ids) == 5
    assert (completion.finish_reason, completion.stop_reason) == ("length", None)
    assert completion.text == model.tokenizer.decode(completion.token_ids)
    assert result.prompt_token_ids == model.tokenizer.encode("Once upon a time")


def test_n_samples_share_one_prefill_and_seeds_reproduce(model, monkeypatch):
    calls = []
    forward = model.forward

    def recording_forward(cache, tokens, **kwargs):
        calls.append([len(row) for row in tokens])
        return forward(cache, tokens, **kwargs)

    monkeypatch.setattr(model, "forward", recording_forward)
    prompt = "The best thing about autumn is"
    params = SamplingParams(n=4, max_tokens=6, seed=1, ignore_eos=True)
    result = generate(model, prompt, params, chat=False)
    prompt_length = len(result.prompt_token_ids)
    # One prefill of one row, then one batched call per new token for the 4 rows.
    assert calls == [[prompt_length]] + [[1, 1, 1, 1]] * 5
    assert result.cost.model_calls == 6
    assert all(len(c.token_ids) == 6 for c in result.completions)
    assert len({tuple(c.token_ids) for c in result.completions}) > 1  # rows draw independently

    # The same seed replays the draws, here through `stream`, whose pieces make up the texts.
    again = GenerationResult([], [])
    pieces = [""] * 4
    for event in stream(model, prompt, params, chat=False, result=again):
        pieces[event.index] += event.text
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in result.completions]
    assert pieces == [c.text for c in again.completions] == [c.text for c in result.completions]
    other = generate(model, prompt, SamplingParams(n=4, max_tokens=6, seed=2, ignore_eos=True), chat=False)
    assert [c.token_ids for c in other.completions] != [c.token_ids for c in result.completions]


def test_empty_prompt_raises(model):
    for prompt in ("", []):
        with pytest.raises(ValueError, match="prompt is empty"):
            generate(model, prompt, SamplingParams(max_tokens=1))


def test_prompt_longer_than_the_context_raises(model):
    too_long = [1] * model.max_context
    with pytest.raises(ValueError, match=rf"prompt has {model.max_context} tokens, the model's context is"):
        generate(model, too_long, SamplingParams(max_tokens=1))


def test_greedy_sampling_logprob_is_zero_and_special_tokens_stay_out_of_text(model):
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    completion = generate(model, "Say hi.", params).completions[0]
    assert completion.sampling_logprobs == [0.0] * len(completion.token_ids)
    assert "<|im_end|>" not in completion.text


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([-1], r"prompt token id -1 \(item 0\) is out of range: must be in \[0, 49152\)"),
        ([1, 2**40], r"prompt token id 1099511627776 \(item 1\) is out of range"),
        (b"Hi", "prompt is bytes"),
        ("caf\udce9", r"character 3 is the lone surrogate '\\udce9'"),
        ([{"role": "user", "content": "caf\udce9"}], r"messages\[0\]\['content'\] is not valid Unicode"),
    ],
)
def test_bad_prompts_raise_value_errors_with_the_real_tokenizer(model, prompt, message):
    """Regression: [-1] raised OverflowError from the detokenizer, a lone surrogate (what
    sys.argv holds for bytes that are not UTF-8) TypeError from the tokenizer, and b"Hi" was
    generated from as the ids [72, 105]."""
    with pytest.raises(ValueError, match=message):
        generate(model, prompt, SamplingParams(max_tokens=1))
