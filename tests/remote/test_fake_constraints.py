"""Structured outputs sent to each engine under its documented request fields (the fake server of
tests/remote/fake_server.py records the bodies; each test names the engine whose request schema
it checks), the kinds an engine cannot take refused before any request, and `complete` set from
the finish reason the engine reports."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("llguidance")

from metagen.decoding import capabilities as caps
from metagen.remote import OpenAIGenerator
from metagen.remote.constraints import gbnf_literal, regex_literal
from metagen.sampling import SamplingParams

from .fake_server import FakeServer

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
CHAT = [{"role": "user", "content": "Where?"}]
CHOICES = ["a|b", 'say "hi"', "1.5\\n"]


def sent(engine: str, prompt, constraint: dict, **params) -> dict:
    """The generation request body `engine`'s fake server received for `constraint` (a text
    prompt on /v1/completions, messages on /v1/chat/completions)."""
    with FakeServer(engine) as server:
        generator = OpenAIGenerator(server.url, max_retries=0, chat=False)
        generator.generate(prompt, SamplingParams(max_tokens=4, structured_outputs=constraint, **params))
        return server.posts()[-1]


def refused(engine: str, prompt, constraint: dict) -> str:
    """The error `engine`'s generator raises for `constraint` (a text prompt on /v1/completions);
    no generation request is sent."""
    with FakeServer(engine) as server:
        generator = OpenAIGenerator(server.url, max_retries=0, chat=False)
        generator.profile  # probe first: the requests counted below are generation requests
        probes = len(server.posts())
        with pytest.raises(ValueError) as error:
            generator.generate(prompt, SamplingParams(max_tokens=4, structured_outputs=constraint))
        assert len(server.posts()) == probes
    return str(error.value)


# vLLM: entrypoints/openai/protocol.py, `structured_outputs` (StructuredOutputsParams) on both endpoints.
@pytest.mark.parametrize(("constraint", "expected"), [
    ({"json": SCHEMA}, {"json": SCHEMA, "whitespace_pattern": "[ \\t\\n\\r]{0,8}"}),
    ({"json": SCHEMA, "max_whitespace": 0}, {"json": SCHEMA, "disable_any_whitespace": True}),
    ({"json": SCHEMA, "max_whitespace": None}, {"json": SCHEMA}),
    ({"json_object": True}, {"json_object": True, "whitespace_pattern": "[ \\t\\n\\r]{0,8}"}),
    ({"regex": "[0-9]{3}"}, {"regex": "[0-9]{3}"}),
    ({"choice": CHOICES}, {"choice": CHOICES}),
    ({"grammar": 'start: "x"'}, {"grammar": 'start: "x"'}),
])
def test_vllm_gets_structured_outputs(constraint, expected):
    for prompt in ("Where?", CHAT):
        body = sent("vllm", prompt, constraint)
        assert body["structured_outputs"] == expected
        assert "response_format" not in body


# SGLang: srt/entrypoints/openai/protocol.py, CompletionRequest.json_schema / regex / ebnf and
# ChatCompletionRequest.response_format / regex / ebnf.
def test_sglang_gets_response_format_json_schema_regex_and_ebnf():
    chat = sent("sglang", CHAT, {"json": SCHEMA})
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}
    assert json.loads(sent("sglang", "Where?", {"json": SCHEMA})["json_schema"]) == SCHEMA
    assert sent("sglang", CHAT, {"json_object": True})["response_format"] == {"type": "json_object"}
    assert json.loads(sent("sglang", "Where?", {"json_object": True})["json_schema"]) == {"type": "object"}
    assert sent("sglang", CHAT, {"regex": "[0-9]+"})["regex"] == "[0-9]+"
    assert sent("sglang", "Where?", {"grammar": 'root ::= "x"'})["ebnf"] == 'root ::= "x"'
    assert sent("sglang", CHAT, {"choice": CHOICES})["regex"] == 'a\\|b|say "hi"|1\\.5\\\\n'


# llama-cpp-python: server/types.py, `grammar` (GBNF) on both endpoints, `response_format`
# {"type": "json_object", "schema": ...} on /v1/chat/completions only.
def test_llama_cpp_gets_response_format_on_chat_and_gbnf_grammars():
    assert sent("llama.cpp", CHAT, {"json": SCHEMA})["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert sent("llama.cpp", CHAT, {"json_object": True})["response_format"] == {"type": "json_object"}
    assert sent("llama.cpp", "Where?", {"grammar": 'root ::= "x"'})["grammar"] == 'root ::= "x"'
    grammar = sent("llama.cpp", "Where?", {"choice": CHOICES})["grammar"]
    assert grammar == 'root ::= "a|b" | "say \\"hi\\"" | "1.5\\\\n"\n'


# OpenAI: response_format json_schema (strict) / json_object on chat completions only.
def test_openai_gets_strict_response_format():
    assert sent("openai", CHAT, {"json": SCHEMA})["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}
    assert sent("openai", CHAT, {"json_object": True})["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(("engine", "prompt", "constraint", "message"), [
    ("openai", CHAT, {"regex": "a+"}, "structured_outputs.regex is not supported by openai's"),
    ("openai", CHAT, {"choice": ["a"]}, "structured_outputs.choice is not supported by openai's"),
    ("openai", CHAT, {"grammar": 'start: "a"'}, "structured_outputs.grammar is not supported by openai's"),
    ("openai", "Where?", {"json": SCHEMA}, "needs openai's /v1/chat/completions"),
    ("llama.cpp", CHAT, {"regex": "a+"}, "GBNF grammars, which have no regular expressions"),
    ("llama.cpp", "Where?", {"json": SCHEMA}, "its /v1/completions has no response_format"),
    ("llama.cpp", CHAT, {"grammar": 'start: "a"'}, "is a Lark grammar, which llama.cpp's server does not take"),
    ("sglang", CHAT, {"grammar": 'start: "a"'}, "is a Lark grammar, which sglang's server does not take"),
])
def test_kinds_an_engine_cannot_take_are_refused_with_the_reason(engine, prompt, constraint, message):
    assert message in refused(engine, prompt, constraint)


def test_response_format_spelling_reaches_the_engine_and_errors_name_it():
    with FakeServer("vllm") as server:
        OpenAIGenerator(server.url, max_retries=0).generate(CHAT, SamplingParams(
            max_tokens=4, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}))
        assert server.posts()[-1]["structured_outputs"]["json"] == SCHEMA
    with FakeServer("openai") as server:
        with pytest.raises(ValueError, match="response_format.json_schema.schema needs openai's /v1/chat"):
            OpenAIGenerator(server.url, max_retries=0, chat=False).generate("Where?", SamplingParams(
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "openai"])
def test_every_engine_declares_structured_output(engine):
    with FakeServer(engine) as server:
        assert caps.STRUCTURED_OUTPUT in OpenAIGenerator(server.url, max_retries=0).capabilities


@pytest.mark.parametrize(("finish", "stop", "complete"), [("stop", None, True), ("length", None, False),
                                                          ("stop", "}", False)])
def test_complete_follows_the_finish_reason_of_a_constrained_answer(finish, stop, complete):
    with FakeServer("vllm") as server:
        server.constrained_text = '{"city": "Paris"}' if stop is None else '{"city": "Paris"'
        server.constrained_finish, server.constrained_stop = finish, stop  # a stop string cut the text
        result = OpenAIGenerator(server.url, max_retries=0).generate(
            CHAT, SamplingParams(max_tokens=4, stop=stop or (), structured_outputs={"json": SCHEMA}))
    assert result.completions[0].complete is complete
    with FakeServer("vllm") as server:  # unconstrained: no verdict
        assert OpenAIGenerator(server.url, max_retries=0).generate(CHAT, SamplingParams(max_tokens=4)) \
            .completions[0].complete is None


def test_literals_escape_exactly_what_their_syntax_needs():
    import re

    for text in CHOICES + ["plain", "(x)*", "tab\there"]:
        assert re.fullmatch(regex_literal(text), text)
    assert gbnf_literal('q"\\\n\x01é') == '"q\\"\\\\\\n\\x01é"'
