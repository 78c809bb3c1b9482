"""Parsing choices (pure functions, no server)."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")

from metagen.remote.engines import ENGINES, sampling_fields
from metagen.remote.responses import parse_choice, parse_choices, token_id
from metagen.remote.transport import ServerError
from metagen.sampling import SamplingParams


def test_token_id_reads_only_vllms_form():
    assert token_id("token_id:42") == 42
    assert token_id("token_id:") is None and token_id(" Paris") is None and token_id("token_id:-3") is None


def test_vllm_return_token_ids_field_gives_the_ids():
    # vLLM >= 0.10.2 with return_token_ids=true: choices carry "token_ids" (texts stay texts)
    choice = {"index": 0, "text": " a b", "finish_reason": "stop", "stop_reason": 2, "token_ids": [5, 6],
              "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-1.0, -2.0], "top_logprobs": None}}
    completion = parse_choice(choice, chat=False, top_k=None)
    assert completion.token_ids == [5, 6] and completion.stop_reason == 2
    assert completion.tokens == [" a", " b"] and completion.logprobs == [-1.0, -2.0]


def test_text_keyed_top_logprobs_do_not_pass_for_id_keyed_ones():
    choice = {"index": 0, "text": " a", "finish_reason": "length",
              "logprobs": {"tokens": [" a"], "token_logprobs": [-0.1], "top_logprobs": [{" a": -0.1, " b": -3.0}]}}
    completion = parse_choice(choice, chat=False, top_k=1)
    assert completion.top_logprobs is None and completion.top_logprob_texts == [{" a": -0.1}]
    assert completion.token_ids is None


@pytest.mark.parametrize("payload, message", [
    ({"object": "list"}, "no 'choices' list"),
    ({"choices": [{"index": 0, "finish_reason": "stop"}]}, "malformed choice"),
    ({"choices": [{"index": 0, "text": "x", "finish_reason": "abort"}]}, "finish_reason='abort'"),
    ({"choices": [{"index": 0, "text": "x", "finish_reason": "stop",
                   "logprobs": {"tokens": [7], "token_logprobs": [-1.0]}}]}, "logprobs tokens are not all strings"),
])
def test_malformed_answers_are_server_errors(payload, message):
    with pytest.raises(ServerError, match=message):
        parse_choices(payload, "http://h/v1/completions", chat=False, top_k=None, expected=1)


def test_openai_refuses_the_extras_and_sends_only_its_own_fields():
    with pytest.raises(ValueError, match="top_k=5 is not supported by openai"):
        sampling_fields(SamplingParams(top_k=5), ENGINES["openai"])
    body = sampling_fields(SamplingParams(max_tokens=3), ENGINES["openai"])
    assert body == {"temperature": 1.0, "top_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                    "max_tokens": 3}


def _answer(*indices):
    return {"choices": [{"index": i, "text": "x", "finish_reason": "stop"} for i in indices]}


@pytest.mark.parametrize("payload, message", [
    (_answer(0, 5), r"choice index 5, but the request asked for 2 choices \(0 to 1\)"),
    (_answer(0, 0), r"choice index 0 twice"),
    (_answer(0, True), r"choice index True, but the request asked for 2 choices"),
])
def test_choice_indices_must_be_the_asked_ones(payload, message):
    with pytest.raises(ServerError, match=message):
        parse_choices(payload, "http://h/v1/completions", chat=False, top_k=None, expected=2)


@pytest.mark.parametrize("usage, message", [
    ({"prompt_tokens": 5, "completion_tokens": -3}, r"usage.completion_tokens=-3 .*a non-negative integer"),
    ({"prompt_tokens": -5, "completion_tokens": 3}, r"usage.prompt_tokens=-5 "),
    ({"prompt_tokens": 5, "completion_tokens": "many"}, r"usage.completion_tokens='many' "),
    ({"prompt_tokens": 5, "completion_tokens": 2.5}, r"usage.completion_tokens=2.5 "),
    ({"prompt_tokens": 5, "completion_tokens": True}, r"usage.completion_tokens=True "),
    ({"prompt_tokens": 5}, r"usage.completion_tokens is missing"),
    ({"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": -1}},
     r"usage.prompt_tokens_details.cached_tokens=-1 "),
    ({"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 6}},
     r"usage.prompt_tokens_details.cached_tokens=6 .*more than usage.prompt_tokens=5"),
])
def test_malformed_usage_is_the_servers_error_never_a_negative_cost(usage, message):
    from metagen.remote.responses import usage_cost

    with pytest.raises(ServerError, match=message) as raised:
        usage_cost({"usage": usage}, "http://h/v1/completions", parameter_count=1e6)
    assert not isinstance(raised.value, ValueError)  # ValueErrors are the request's fault (400)


def test_usage_details_may_be_null_or_absent():
    from metagen.remote.responses import usage_cost

    cost = usage_cost({"usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None}},
                      "http://h/v1/completions", parameter_count=None)
    assert (cost.prompt_tokens_computed, cost.prompt_tokens_reused, cost.generated_tokens) == (5, 0, 2)
