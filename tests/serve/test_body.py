"""What every body meets: which request field an error's message is about (`param_of`)."""

from __future__ import annotations

import pytest

from metagen.serve.body import param_of
from metagen.serve.request_fields import SAMPLING_FIELDS


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
    assert param_of(message, names) == param
