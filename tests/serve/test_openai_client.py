"""`metagen serve` driven by the official openai client: completions, chat, n, logprobs, seeds,
streams with usage, structured outputs, and equality with the library's own sampling loop."""

from __future__ import annotations

import json
import math

import pytest

from metagen.decoding import generate
from metagen.sampling import SamplingParams

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow


def test_models_lists_the_served_model(client, served_model):
    listed = client.models.list().data
    assert [entry.id for entry in listed] == [served_model]
    assert listed[0].owned_by == "metagen"


def test_completion_equals_the_sampling_loop_with_logprobs(client, served_model, model):
    prompt = "The capital of France is"
    answer = client.completions.create(model=served_model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
    local = generate(model, prompt, SamplingParams(temperature=0, max_tokens=12, logprobs=3), chat=False)
    choice, expected = answer.choices[0], local.completions[0]
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert answer.usage.prompt_tokens == len(local.prompt_token_ids)
    assert answer.usage.completion_tokens == len(expected.token_ids)
    assert choice.logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert all(len(top) == 3 for top in choice.logprobs.top_logprobs)
    # the sampled token's log-prob is the best of its top-3 at T=0
    assert [max(top.values()) for top in choice.logprobs.top_logprobs] == pytest.approx(expected.logprobs, abs=1e-5)


def test_n_samples_with_a_seed_equal_the_sampling_loop_and_repeat(client, served_model, model):
    prompt = [1, 504, 3458, 282]  # a token-id prompt
    kwargs = dict(model=served_model, prompt=prompt, max_tokens=10, temperature=1.0, top_p=0.9, n=3, seed=11)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    local = generate(model, prompt, SamplingParams(temperature=1.0, top_p=0.9, n=3, seed=11, max_tokens=10))
    texts = [choice.text for choice in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in local.completions]
    assert texts == [choice.text for choice in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # three draws, not one copied


def test_chat_with_logprobs_and_extra_sampling_fields(client, served_model, model):
    messages = [{"role": "user", "content": "Name a fruit."}]
    answer = client.chat.completions.create(
        model=served_model, messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"repetition_penalty": 1.3, "stop": ["\n"]})
    local = generate(model, messages, SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3,
                                                     stop=["\n"], logprobs=2))
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == local.completions[0].text
    content = choice.logprobs.content
    assert [entry.logprob for entry in content] == pytest.approx(local.completions[0].logprobs, abs=1e-5)
    assert all(len(entry.top_logprobs) == 2 for entry in content)
    assert all(sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1.0 + 1e-6 for entry in content)


def test_streams_give_the_same_text_and_usage(client, served_model):
    kwargs = dict(model=served_model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=20,
                  temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens

    completion = list(client.completions.create(model=served_model, prompt="One, two,", max_tokens=8,
                                                temperature=0, stream=True))
    plain = client.completions.create(model=served_model, prompt="One, two,", max_tokens=8, temperature=0)
    assert "".join(chunk.choices[0].text for chunk in completion) == plain.choices[0].text
    assert all(chunk.usage is None for chunk in completion)  # no usage chunk unless asked


def test_json_schema_response_format_validates(client, served_model):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    answer = client.chat.completions.create(
        model=served_model, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=60,
        temperature=0.7, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_concurrent_requests_give_what_each_gives_alone(client, served_model, server):
    requests = [
        dict(prompt="The capital of France is", max_tokens=24, temperature=0),
        dict(prompt="def fibonacci(n):", max_tokens=30, temperature=0),
        dict(prompt="Once upon a time", max_tokens=20, temperature=0.9, seed=5, n=2),
        dict(prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, extra_body={"top_k": 5}),
        dict(prompt="Water boils at", max_tokens=28, temperature=0, stop=["."]),
    ]

    def run(kwargs):
        answer = client.completions.create(model=served_model, **kwargs)
        return [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)]

    alone, together, rows_per_step = server.alone_and_together(run, requests)
    assert together == alone
    assert rows_per_step > 1.5  # the requests were decoded as one batch, not one after another


def test_echo_returns_the_prompt_with_its_log_probabilities(client, served_model, model):
    import torch

    prompt = "The capital of France is"
    answer = client.completions.create(model=served_model, prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                       logprobs=1)
    plain = client.completions.create(model=served_model, prompt=prompt, max_tokens=4, temperature=0)
    choice = answer.choices[0]
    assert choice.text == prompt + plain.choices[0].text
    ids = model.tokenizer.encode(prompt)
    cache = model.new_cache(1)
    logits = model.forward(cache, [ids], logits="all").logits[0]  # (T, V)
    expected = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()
    scored = choice.logprobs.token_logprobs
    assert len(scored) == len(ids) + 4 and scored[0] is None
    assert scored[1:len(ids)] == pytest.approx(expected, abs=1e-4)
    assert choice.logprobs.top_logprobs[0] is None and len(choice.logprobs.top_logprobs[1]) == 1
    assert "".join(choice.logprobs.tokens) == choice.text
    assert answer.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=served_model, prompt=prompt, max_tokens=4, echo=True, stream=True)
    assert raised.value.param == "echo"


def test_chat_stream_with_n_and_logprobs_matches_the_whole_answer(client, served_model):
    kwargs = dict(model=served_model, messages=[{"role": "user", "content": "Say something."}], max_tokens=12,
                  temperature=1.0, seed=21, n=2, logprobs=True, top_logprobs=1)
    whole = client.chat.completions.create(**kwargs)
    texts, logprobs = ["", ""], [[], []]
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs is not None:
                logprobs[choice.index] += [entry.logprob for entry in choice.logprobs.content]
    for choice in whole.choices:
        assert texts[choice.index] == choice.message.content
        assert logprobs[choice.index] == [entry.logprob for entry in choice.logprobs.content]
    assert texts[0] != texts[1]


def test_token_healing_equals_the_sampling_loop_and_is_refused_where_it_cannot_apply(client, served_model, model):
    prompt = "The url is http:"  # ends mid-token: ":" is backed up and the output starts with it
    answer = client.completions.create(model=served_model, prompt=prompt, max_tokens=8, temperature=0,
                                       extra_body={"token_healing": True})
    local = generate(model, prompt, SamplingParams(temperature=0, max_tokens=8, token_healing=True), chat=False)
    assert local.healed_text == ":"
    assert answer.choices[0].text == local.completions[0].text
    assert answer.usage.prompt_tokens == len(local.prompt_token_ids)
    with pytest.raises(openai.BadRequestError) as refused:  # a chat prompt ends with the assistant header
        client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=4, extra_body={"token_healing": True})
    assert refused.value.body["param"] == "token_healing"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=served_model, prompt=prompt, max_tokens=4, echo=True,
                                  extra_body={"token_healing": True})
    assert refused.value.body["param"] == "token_healing"


def test_a_stream_names_the_stop_that_ended_it_as_the_whole_answer_does(client, served_model):
    # The last chunk's stop_reason comes from the engine's TokenEvent; the whole answer's from the row.
    free = client.completions.create(model=served_model, prompt="One, two,", max_tokens=8, temperature=0)
    stop = free.choices[0].text.split(",")[1]  # a word the greedy output reaches after its first comma
    assert stop.strip(), free.choices[0].text
    kwargs = dict(model=served_model, prompt="One, two,", max_tokens=8, temperature=0, stop=[stop])
    whole = client.completions.create(**kwargs).choices[0]
    ends = [chunk.choices[0] for chunk in client.completions.create(stream=True, **kwargs)
            if chunk.choices[0].finish_reason is not None]
    assert whole.finish_reason == "stop" and whole.stop_reason == stop
    assert [(end.finish_reason, end.stop_reason) for end in ends] == [("stop", stop)]
