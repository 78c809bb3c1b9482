"""Streamed completions (`remote/streaming.py`) against scripted servers: the pieces join to what
`generate` returns, usage is read where the engine streams it, a fleet fails over while nothing
has arrived, and failures are raised with the server's message."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")

from metagen.remote import FleetGenerator, InvalidRequestError, OpenAIGenerator
from metagen.remote.streaming import stream
from metagen.sampling import SamplingParams

from .conftest import free_port
from .fake_server import FakeServer

PROMPT = "The capital of France is"  # raw text on /v1/completions (chat=False), as proxy mode relays it


def _stream(generator, prompt, params):
    """(text per completion index, finish reasons, StreamedCost) of one streamed request."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}

    def on_piece(piece) -> None:
        texts[piece.index] = texts.get(piece.index, "") + piece.text
        if piece.finish_reason:
            finishes[piece.index] = piece.finish_reason

    streamed = generator.loop.run(stream(generator, prompt, params, on_piece))
    return [texts[i] for i in sorted(texts)], finishes, streamed


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_pieces_join_to_the_generated_text(engine):
    params = SamplingParams(n=3, seed=4, max_tokens=4)
    with FakeServer(engine) as fake, OpenAIGenerator(fake.url, chat=False, max_retries=0) as generator:
        whole = generator.generate(PROMPT, params)
        texts, finishes, streamed = _stream(generator, PROMPT, params)
        sent = fake.posts()[-1]
    assert texts == [c.text for c in whole.completions] and len(set(texts)) == 3
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert sent["stream"] is True and "logprobs" not in sent  # no logprobs asked: none requested
    if engine == "vllm":  # honours n, streams usage: one request, its tokens counted
        assert sent.get("stream_options") == {"include_usage": True}
        assert streamed.usage_known and streamed.cost.generated_tokens == whole.cost.generated_tokens == 12
        assert streamed.cost.model_calls == 1
    else:  # llama.cpp: n fanned out (3 requests, derived seeds as generate's), no usage in a stream
        assert "stream_options" not in sent
        assert not streamed.usage_known and streamed.cost.model_calls == 3


def test_a_fleet_stream_fails_over_from_a_dead_endpoint():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with FakeServer("vllm") as fake:
        with FleetGenerator([dead, fake.url], chat=False, max_retries=0, health_interval=None) as fleet:
            for _ in range(3):  # the dead one is chosen first (fewest answered) until taken out
                texts, _, _ = _stream(fleet, PROMPT, SamplingParams(max_tokens=4, seed=1))
                assert texts == [fleet.generate(PROMPT, SamplingParams(max_tokens=4, seed=1)).text]
            stats = fleet.stats()
    assert not stats[dead]["up"] and stats[fake.url]["requests"] == 6


def test_a_refused_stream_raises_the_server_message():
    with FakeServer("vllm") as fake, OpenAIGenerator(fake.url, chat=False, max_retries=0) as generator:
        generator.profile  # probed before the fault is scripted
        fake.fail(400, b'{"error": {"message": "max_tokens is too large"}}')
        with pytest.raises(InvalidRequestError, match="max_tokens is too large"):
            _stream(generator, PROMPT, SamplingParams(max_tokens=4))
    with FakeServer("vllm") as fake, \
            OpenAIGenerator(fake.url, engine="openai", chat=False, max_retries=0) as openai_like:
        with pytest.raises(ValueError, match="ignore_eos"):  # refused before sending, as generate refuses it
            _stream(openai_like, PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))
        assert not any(body.get("stream") for body in fake.posts())  # only the probe was sent


def test_text_only_requests_ask_for_no_logprobs_unless_the_params_do():
    """Proxy mode's plain requests (`text_only`): logprobs cost llama-cpp-python's server ~5x."""
    with FakeServer("vllm") as fake, OpenAIGenerator(fake.url, chat=False, max_retries=0) as generator:
        plain = generator.loop.run(generator._generate(PROMPT, SamplingParams(max_tokens=4), None, text_only=True))
        sent = fake.posts()[-1]
        assert not {"logprobs", "top_logprobs", "return_tokens_as_token_ids"} & set(sent)
        assert plain.text == generator.generate(PROMPT, SamplingParams(max_tokens=4)).text
        assert "logprobs" in fake.posts()[-1]  # generate asks, to fill Completion.logprobs
        generator.loop.run(generator._generate(PROMPT, SamplingParams(max_tokens=4, logprobs=2), None, text_only=True))
        assert fake.posts()[-1]["logprobs"] == 2


def _without_finish(chunks):
    """The stream cut before its last choice's finish_reason (a server that dropped the end)."""
    return [chunk for chunk in chunks if not any(c.get("finish_reason") and c["index"] == 2 for c in chunk["choices"])]


def _one_choice_fewer(chunks):
    return [chunk for chunk in chunks if not any(c["index"] == 2 for c in chunk["choices"])]


def _without_usage(chunks):
    """vLLM asked for usage (stream_options.include_usage) but the stream ends without it."""
    return [chunk for chunk in chunks if "usage" not in chunk]


def _index(value):
    def edit(chunks):
        chunks[0]["choices"][0]["index"] = value
        return chunks
    return edit


def _finish(value):
    def edit(chunks):
        last = next(c for chunk in chunks for c in chunk["choices"] if c.get("finish_reason"))
        last["finish_reason"] = value
        return chunks
    return edit


def _text(value):
    def edit(chunks):
        chunks[0]["choices"][0]["text"] = value
        return chunks
    return edit


@pytest.mark.parametrize("edit, message", [
    (_without_finish, r"ended without a finish_reason for choice 2 of 3"),
    (_one_choice_fewer, r"ended without a finish_reason for choice 2 of 3"),
    (_without_usage, r"ended without the usage asked for \(stream_options.include_usage\)"),
    (_index(3), r"choice index 3, but the request asked for 3 choices \(0 to 2\)"),
    (_index(-1), r"choice index -1, but the request asked for 3 choices"),
    (_index("0"), r"choice index '0', but the request asked for 3 choices"),
    (_finish("abort"), r"finish_reason='abort' \(expected 'stop' or 'length'\)"),
    (_text(7), r"choice 0 has text 7 \(expected a string\)"),
])
def test_an_incomplete_or_malformed_stream_is_an_error_not_a_shorter_answer(edit, message):
    """The rule of `parse_choices` for whole answers: every asked choice ends with stop / length,
    every index is one the request asked for, or the stream is a ServerError naming what was sent."""
    from metagen.remote import ServerError

    with FakeServer("vllm") as fake, OpenAIGenerator(fake.url, chat=False, max_retries=0) as generator:
        generator.profile
        fake.stream_edit = edit
        with pytest.raises(ServerError, match=message) as raised:
            _stream(generator, PROMPT, SamplingParams(n=3, seed=4, max_tokens=4))
    assert raised.value.url == f"{fake.url}/completions"


def test_negative_usage_in_a_stream_is_a_server_error():
    from metagen.remote import ServerError

    with FakeServer("vllm") as fake, \
            OpenAIGenerator(fake.url, chat=False, max_retries=0, parameter_count=1e6) as generator:
        generator.profile
        fake.usage_edit = lambda usage: {**usage, "completion_tokens": -12}
        with pytest.raises(ServerError, match=r"usage.completion_tokens=-12 .*a non-negative integer"):
            _stream(generator, PROMPT, SamplingParams(n=3, seed=4, max_tokens=4))


@pytest.mark.parametrize("retry_after", ["86400", "Fri, 01 Jan 2100 00:00:00 GMT"])
def test_a_stream_refused_with_a_day_long_retry_after_fails_at_once(retry_after):
    """A gateway answering a streamed request 429 with a day-long Retry-After: the stream, like a
    whole answer (test_transport.py), fails at once instead of waiting (it may then fail over)."""
    import random

    from metagen.remote.sse import sse_chunks
    from metagen.remote.transport import ServerError, Transport

    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    with FakeServer() as fake:
        fake.fail(429, b'{"error": {"message": "quota exhausted"}}', {"Retry-After": retry_after})
        transport = Transport(fake.url, sleep=record, rng=random.Random(0), max_retries=4)

        async def first_chunk():
            async for chunk in sse_chunks(transport, "completions", {"prompt": "Hi", "max_tokens": 1, "stream": True}):
                return chunk

        with pytest.raises(ServerError, match=r"Retry-After \d+ s is more than the 60 s") as error:
            transport.loop.run(first_chunk())
        transport.close()
    assert waits == [] and error.value.status == 429 and error.value.busy
