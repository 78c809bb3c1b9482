"""Request bodies -> ParsedRequest: what each field becomes, and which field each refusal names."""

from __future__ import annotations

import pytest

from metagen.serve.protocol import SAMPLING_FIELDS, APIError, _param_of, parse_request

pytestmark = pytest.mark.slow  # the embedded model's tokenizer and chat template


def parse(model, body, chat=False, **options):
    return parse_request(body, chat=chat, model=model, served_name="m", max_rows=8, **options)


def refusal(model, body, chat=False, **options) -> APIError:
    with pytest.raises(APIError) as raised:
        parse(model, body, chat, **options)
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


def test_chat_fields(model):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    parsed = parse(model, {"messages": messages, "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 5,
                           "stream": True, "stream_options": {"include_usage": True}}, chat=True)
    assert parsed.prompt_ids == model.tokenizer.encode_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        add_generation_prompt=True)
    assert (parsed.params.logprobs, parsed.params.max_tokens, parsed.stream, parsed.include_usage) == (2, 5, True, True)
    default = parse(model, {"messages": messages[1:]}, chat=True)  # no limit given: the rest of the context
    assert default.params.max_tokens == model.max_context - len(default.prompt_ids)
    assert not default.logprobs and default.params.logprobs is None


@pytest.mark.parametrize("body, chat, param, message", [
    ({"prompt": "Hi", "max_tokens": 0}, False, "max_tokens", "max_tokens=0"),
    ({"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0}, True, "max_completion_tokens",
     "out of range"),
    ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 99}, True, "top_logprobs",
     "out of range"),
    ({"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, True, "top_logprobs", "needs logprobs"),
    ({"messages": [{"role": "user", "content": "Hi", "name": "x"}]}, True, "messages[0].name", "unsupported field"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, True, "messages[0].content[0]",
     "text part"),
    ({"prompt": ["a", "b"]}, False, "prompt", "one prompt per request"),
    ({"prompt": [1, "a"]}, False, "prompt", "list of int token ids"),
    ({"prompt": [10**9]}, False, "prompt", "out of range"),
    ({}, False, "prompt", "prompt is required"),
    ({"prompt": "Hi", "suffix": "x"}, False, "suffix", "not supported"),
    ({"prompt": "Hi", "best_of": 3}, False, "best_of", "only best_of equal to n"),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, False, "stream_options", "only allowed with stream"),
    ({"prompt": "Hi", "stream": "yes"}, False, "stream", "true or false"),
    ({"prompt": "Hi", "logit_bias": {"x": 1}}, False, "logit_bias", "not a token id"),
    ({"prompt": "Hi", "logit_bias": {"999999999": 1}}, False, "logit_bias", "out of range"),
    ({"prompt": "Hi", "mirostat_tau": 5.0, "top_k": 3}, False, "mirostat_tau", "cannot be combined"),
    ({"prompt": "Hi", "structured_outputs": {"regexp": "a"}}, False, "structured_outputs", "unknown fields"),
    ({"prompt": "Hi", "response_format": {"type": "json_schema", "json_schema": {"schema": "{not json"}}}, False,
     "response_format.json_schema.schema", "is not valid JSON"),
    ({"prompt": "Hi", "response_format": {"type": "json_schema", "json_schema": {"schema": "[" * 10**5}}}, False,
     "response_format.json_schema.schema", "100000 deep, more than the limit of 128"),
    ({"prompt": "Hi", "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, False,
     "structured_outputs", "not both"),
    ({"prompt": "Hi", "logprobs": -1}, False, "logprobs", "out of range"),
    ({"prompt": "Hi", "model": "other"}, False, "model", "not served here"),
    ({"prompt": "Hi", "n": 9}, False, "n", "--max-rows 8"),
    ({"prompt": "Hi", "mirostat_mode": 1, "mirostat_tau": 5.0}, False, "mirostat_mode", "0 (off) or 2"),
    ({"prompt": "Hi", "mirostat_mode": 2}, False, "mirostat_mode", "needs mirostat_tau"),
    ({"prompt": "Hi", "mirostat_mode": 0, "mirostat_tau": 5.0}, False, "mirostat_mode", "drop mirostat_tau"),
])
def test_refusals_name_the_field(model, body, chat, param, message):
    error = refusal(model, body, chat)
    assert error.param == param and message in error.message


def test_lenient_drops_unknown_fields_but_lists_them(model):
    assert refusal(model, {"prompt": "Hi", "frequency": 1}).param == "frequency"
    parsed = parse(model, {"prompt": "Hi", "frequency": 1, "abc": 2}, lenient=True)
    assert parsed.ignored == ("abc", "frequency")


@pytest.mark.parametrize("message, param", [
    ("temperature=-1 is out of range: must be in [0, inf)", "temperature"),
    ("response_format.json_schema.schema='{}' does not compile: ...", "response_format.json_schema.schema"),
    ("logprobs=99 is out of range", "top_logprobs"),  # mapped to the request's spelling
    ("stop_token_ids entry -1 is out of range", "stop_token_ids"),
    ("Expecting value: line 1 column 1 (char 0)", None),  # a message's first word is not a field
    ("maximum recursion depth exceeded", None),
    ("recursion too deep", None),
    ("nested.path is wrong", None),
    ("temperatures=1", None),  # a field's name as a prefix of a longer word
    ("metagen.Expecting value", None),
    ("metagen.n=0 is out of range", "metagen.n"),
    ("metagen.my option is not an option of strategy 'best_of_n'", "metagen.my option"),
])
def test_param_is_a_known_field_or_none(message, param):
    names = {field: field for field in (*SAMPLING_FIELDS, "max_tokens")} | {"logprobs": "top_logprobs"}
    names |= {"metagen.n": "metagen.n", "metagen.my option": "metagen.my option"}
    assert _param_of(message, names) == param


def test_strategy_errors_name_the_option_given_or_metagen(model):
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "best_of_n", "n": "x"}})
    assert error.param == "metagen.n"
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "best_of_n", "no such option": 1}})
    assert error.param == "metagen.no such option"  # the key as given, not "metagen.no"


@pytest.mark.parametrize(("body", "options", "param", "message"), [
    ({"prompt": "Hi", "metagen": {"strategy": "self_consistency", "n": 10**9}}, {}, "metagen.n",
     "metagen.n=1000000000 is out of range: must be <= 128 (--max-n"),
    ({"prompt": "Hi", "metagen": {"strategy": "mcts", "value": "steps", "expansions": 129}}, {}, "metagen.expansions",
     "metagen.expansions=129 is out of range: must be <= 128 (--max-n"),
    ({"prompt": "Hi", "metagen": {"strategy": "rebase", "value": "steps", "max_steps": 10**6}}, {"max_n": 64},
     "metagen.max_steps", "metagen.max_steps=1000000 is out of range: must be <= 64 (--max-n"),
    ({"prompt": "Hi", "model": "self_consistency:m"}, {"max_n": 4}, "metagen.n",
     "metagen.n=8 is out of range: must be <= 4 (--max-n"),
    ({"prompt": "Hi", "n": 5}, {"max_n": 4}, "n", "n=5 is out of range: must be <= 4 (--max-n 4)"),
    ({"prompt": "Hi", "n": 5, "best_of": 5}, {"max_n": 4}, "n", "n=5 is out of range: must be <= 4 (--max-n 4)"),
])
def test_options_that_size_the_work_are_bounded_by_max_n(model, body, options, param, message):
    """Checked while parsing, before anything is allocated for the request."""
    error = refusal(model, body, **options)
    assert error.param == param and error.status == 400
    assert message in error.message


def test_a_strategy_template_with_a_format_spec_is_refused(model):
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "self_refine",
                                                         "critique_template": "{answer:a>20000000}"}})
    assert error.param == "metagen.critique_template" and "format spec" in error.message
