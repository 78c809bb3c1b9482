"""/v1/completions bodies -> ParsedRequest: what each field becomes, and which field each refusal names
(the fields both endpoints share are read by one parse: the chat parser refuses them alike)."""

from __future__ import annotations

import pytest

from metagen.serve.body import APIError
from metagen.serve.chat_request import parse_chat
from metagen.serve.completion_request import parse_completion

pytestmark = pytest.mark.slow  # the embedded model's tokenizer


def parse(model, body, **options):
    return parse_completion(body, model=model, served_name="m", max_rows=8, **options)


def refusal(model, body, **options) -> APIError:
    with pytest.raises(APIError) as raised:
        parse(model, body, **options)
    return raised.value


def test_fields_map_to_sampling_params(model):
    parsed = parse(model, {"model": "m", "prompt": "Hi", "temperature": 0.5, "top_k": 7, "logit_bias": {"42": -3},
                           "stop": "\n", "stop_token_ids": [2], "n": 2, "seed": 9, "logprobs": 3, "top_p": None})
    params = parsed.params
    assert (params.temperature, params.top_k, params.logit_bias, params.stop, params.stop_token_ids) == \
        (0.5, 7, ((42, -3.0),), ("\n",), (2,))
    assert (params.n, params.seed, params.logprobs, params.max_tokens, params.top_p) == (2, 9, 3, 16, 1.0)
    assert parsed.logprobs and not parsed.chat and parsed.prompt_ids == model.tokenizer.encode("Hi")
    assert parse(model, {"prompt": [[5, 6, 7]]}).prompt_ids == [5, 6, 7]  # a list of one token-id prompt


@pytest.mark.parametrize("body, param, message", [
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens", "max_tokens=0"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": [1, "a"]}, "prompt", "list of int token ids"),
    ({"prompt": [10**9]}, "prompt", "out of range"),
    ({}, "prompt", "prompt is required"),
    ({"prompt": "Hi", "suffix": "x"}, "suffix", "not supported"),
    ({"prompt": "Hi", "best_of": 3}, "best_of", "only best_of equal to n"),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"prompt": "Hi", "stream": "yes"}, "stream", "true or false"),
    ({"prompt": "Hi", "logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
    ({"prompt": "Hi", "logit_bias": {"999999999": 1}}, "logit_bias", "out of range"),
    ({"prompt": "Hi", "mirostat_tau": 5.0, "top_k": 3}, "mirostat_tau", "cannot be combined"),
    ({"prompt": "Hi", "structured_outputs": {"regexp": "a"}}, "structured_outputs", "unknown fields"),
    ({"prompt": "Hi", "response_format": {"type": "json_schema", "json_schema": {"schema": "{not json"}}},
     "response_format.json_schema.schema", "is not valid JSON"),
    ({"prompt": "Hi", "response_format": {"type": "json_schema", "json_schema": {"schema": "[" * 10**5}}},
     "response_format.json_schema.schema", "100000 deep, more than the limit of 128"),
    ({"prompt": "Hi", "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs", "not both"),
    ({"prompt": "Hi", "logprobs": -1}, "logprobs", "out of range"),
    ({"prompt": "Hi", "model": "other"}, "model", "not served here"),
    ({"prompt": "Hi", "n": 9}, "n", "--max-rows 8"),
    ({"prompt": "Hi", "mirostat_mode": 3, "mirostat_tau": 5.0}, "mirostat_mode", "0 (off), 1 or 2"),
    ({"prompt": "Hi", "mirostat_mode": 1}, "mirostat_mode", "needs mirostat_tau"),
    ({"prompt": "Hi", "mirostat_mode": 2}, "mirostat_mode", "needs mirostat_tau"),
    ({"prompt": "Hi", "mirostat_mode": 0, "mirostat_tau": 5.0}, "mirostat_mode", "drop mirostat_tau"),
])
def test_refusals_name_the_field(model, body, param, message):
    error = refusal(model, body)
    assert error.param == param and message in error.message


@pytest.mark.parametrize(("fields", "version"), [({"mirostat_mode": 1, "mirostat_tau": 5.0}, 1),
                                                 ({"mirostat_mode": 2, "mirostat_tau": 5.0}, 2),
                                                 ({"mirostat_tau": 5.0}, 2)])
def test_mirostat_mode_chooses_the_version(model, fields, version):
    """llama.cpp's numbering: 1 and 2 are the Mirostat versions (0, off, is refused with a tau above)."""
    params = parse(model, {"prompt": "Hi", **fields}).params
    assert (params.mirostat_tau, params.mirostat_mode) == (5.0, version)


def test_mirostat_mode_zero_is_off(model):
    params = parse(model, {"prompt": "Hi", "mirostat_mode": 0}).params
    assert params.mirostat_tau is None and params.mirostat_mode == 2


def test_lenient_drops_unknown_fields_but_lists_them(model):
    assert refusal(model, {"prompt": "Hi", "frequency": 1}).param == "frequency"
    parsed = parse(model, {"prompt": "Hi", "frequency": 1, "abc": 2}, lenient=True)
    assert parsed.ignored == ("abc", "frequency")


@pytest.mark.parametrize("fields", [{"stream": "yes"}, {"temperature": -1}, {"logit_bias": {"x": 1}},
                                    {"mirostat_mode": 2}, {"model": "other"}, {"n": 5, "max_tokens": 1},
                                    {"top_kk": 1}])
def test_both_endpoints_refuse_a_shared_field_alike(model, fields):
    """One parse reads the shared fields: the same message, param and status from either endpoint."""
    with pytest.raises(APIError) as chat:
        parse_chat({"messages": [{"role": "user", "content": "Hi"}], **fields}, model=model, served_name="m",
                   max_rows=8, max_n=4)
    completion = refusal(model, {"prompt": "Hi", **fields}, max_n=4)
    assert (chat.value.message, chat.value.param, chat.value.status) == \
        (completion.message, completion.param, completion.status)


def test_proxy_mode_refuses_any_logprobs_on_completions():
    """Without a local tokenizer even logprobs=0 (the chosen token's text) is refused; chat's
    logprobs=false asks for nothing."""
    with pytest.raises(APIError) as raised:
        parse_completion({"prompt": "Hi", "logprobs": 0}, model=None, served_name="m", max_rows=8)
    assert raised.value.param == "logprobs" and "logprobs=0 is not supported in proxy mode" in raised.value.message
    parsed = parse_chat({"messages": [{"role": "user", "content": "Hi"}], "logprobs": False}, model=None,
                        served_name="m", max_rows=8)
    assert parsed.prompt_ids is None and not parsed.logprobs and parsed.params.logprobs is None
