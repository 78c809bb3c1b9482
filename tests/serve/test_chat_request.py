"""/v1/chat/completions bodies -> ParsedRequest: the messages, logprobs and limit fields, and which
field each refusal names."""

from __future__ import annotations

import pytest

from metagen.serve.body import APIError
from metagen.serve.chat_request import parse_chat

pytestmark = pytest.mark.slow  # the embedded model's tokenizer and chat template


def parse(model, body, **options):
    return parse_chat(body, model=model, served_name="m", max_rows=8, **options)


def test_chat_fields(model):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    parsed = parse(model, {"messages": messages, "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 5,
                           "stream": True, "stream_options": {"include_usage": True}})
    assert parsed.prompt_ids == model.tokenizer.encode_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        add_generation_prompt=True)
    assert (parsed.params.logprobs, parsed.params.max_tokens, parsed.stream, parsed.include_usage) == (2, 5, True, True)
    assert parsed.chat
    default = parse(model, {"messages": messages[1:]})  # no limit given: the rest of the context
    assert default.params.max_tokens == model.max_context - len(default.prompt_ids)
    assert not default.logprobs and default.params.logprobs is None


@pytest.mark.parametrize("body, param, message", [
    ({"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0}, "max_completion_tokens",
     "out of range"),
    ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 99}, "top_logprobs",
     "out of range"),
    ({"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"messages": [{"role": "user", "content": "Hi", "name": "x"}]}, "messages[0].name", "unsupported field"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]", "text part"),
])
def test_refusals_name_the_field(model, body, param, message):
    with pytest.raises(APIError) as raised:
        parse(model, body)
    assert raised.value.param == param and message in raised.value.message
