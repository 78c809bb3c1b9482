"""Transport: retry rule, Retry-After, timeouts, error messages."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

httpx = pytest.importorskip("httpx")

from metagen.remote.transport import (
    InvalidRequestError,
    ServerError,
    Transport,
    retry_after_seconds,
)

from .fake_server import FakeServer


def recording(server: FakeServer, **kwargs) -> tuple[Transport, list[float]]:
    """A transport that records the delays it would sleep between attempts (and does not)."""
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    transport = Transport(server.url, sleep=record, rng=random.Random(0), **kwargs)
    return transport, waits


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "7"})) == 7.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after_seconds(httpx.Response(429, headers={"Retry-After": later})) <= 30
    assert retry_after_seconds(httpx.Response(429)) == 0.0
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "soon"})) == 0.0


def test_backoff_doubles_with_jitter_and_never_undercuts_retry_after():
    with FakeServer() as server:
        transport, waits = recording(server, max_retries=3, backoff=0.5)
        for _ in range(3):
            server.fail(503, '{"error": {"message": "busy"}}')
        transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
        server.fail(429, "{}", {"Retry-After": "20"})
        transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
    # attempt k waits uniform(0.5, 1) * 0.5 * 2^k
    for k, wait in enumerate(waits[:3]):
        assert 0.25 * 2**k <= wait <= 0.5 * 2**k
    assert waits[3] == 20.0 and transport.requests == 2


def test_retries_run_out_with_the_last_status_and_the_servers_message():
    with FakeServer() as server:
        transport, waits = recording(server, max_retries=2)
        for _ in range(3):
            server.fail(502, '{"error": {"message": "upstream gone"}}')
        with pytest.raises(ServerError, match=r"HTTP 502: upstream gone") as error:
            transport.post("completions", {"prompt": "Hi"})
    assert error.value.status == 502 and len(waits) == 2 and not isinstance(error.value, ValueError)


def test_a_read_timeout_is_retried():
    with FakeServer() as server:
        transport, waits = recording(server, timeout=0.3, max_retries=1)
        server.fail(0, delay=1.0)  # the first answer comes too late
        answer = transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
    assert answer["choices"] and len(waits) == 1


def test_a_422_is_an_invalid_request_raised_at_once():
    with FakeServer() as server:
        transport, waits = recording(server)
        server.fail(422, '{"detail": "prompt: Input should be a valid string"}')
        with pytest.raises(InvalidRequestError, match="prompt: Input should be a valid string"):
            transport.post("completions", {"prompt": [1]})
    assert waits == []


def test_base_url_must_be_http():
    with pytest.raises(ValueError, match="base_url='localhost:8000' must start with http"):
        Transport("localhost:8000")


# --- faults of real servers (item by item: what the fake reproduces is named in fake_server.py) ---------


def test_a_server_dripping_its_answer_cannot_hold_a_call_past_its_timeout():
    """A byte every 0.05 s: each read gets something, so httpx's read timeout never fires; the whole
    answer would take ~40 s (the call must end within 15 s: a generous bound for a loaded machine)."""
    with FakeServer() as server:
        transport = Transport(server.url, timeout=1.0, max_retries=0)
        assert transport.get("models")["data"]  # answered: GETs do not drip
        server.drip = 0.05
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"no complete answer within 1 s .*busy, not down") as error:
            transport.post("completions", {"prompt": "Hi", "max_tokens": 4})
        assert time.monotonic() - started < 15
        assert error.value.busy and error.value.status is None
        transport.close()


@pytest.mark.parametrize("retry_after", ["86400", "Fri, 01 Jan 2100 00:00:00 GMT"])
def test_a_retry_after_beyond_the_cap_fails_at_once(retry_after):
    """vLLM / a gateway answering 429 with a day-long Retry-After: not waited for."""
    with FakeServer() as server:
        transport, waits = recording(server, max_retries=4)
        server.fail(429, '{"error": {"message": "quota exhausted"}}', {"Retry-After": retry_after})
        with pytest.raises(ServerError, match=r"quota exhausted \(Retry-After \d+ s is more than the 60 s") as error:
            transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
    assert waits == [] and error.value.status == 429 and error.value.busy


def test_timeouts_of_a_busy_server_are_retried_by_the_deadline_not_counted():
    """A single-slot llama.cpp server working through other requests: it answers GET /v1/models at
    once but a generation late. Two late answers with max_retries=1 still end in an answer."""
    with FakeServer() as server:
        transport, waits = recording(server, timeout=0.3, max_retries=1)
        server.fail(0, delay=1.0)
        server.fail(0, delay=1.0)
        answer = transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
    assert answer["choices"] and len(waits) == 2


def test_a_hanging_server_is_not_busy_and_its_calls_end():
    """A wedged server: it accepts connections and answers nothing, health checks included."""
    with FakeServer() as server:
        transport, waits = recording(server, timeout=0.5, max_retries=1)
        server.hang = True
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"no complete answer within 0.5 s; health check: GET .*/models: no answer within 5 s") as error:
            transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
    assert not error.value.busy and len(waits) == 1
    assert time.monotonic() - started < 30  # two attempts and two health checks of at most 5 s


def test_a_call_ends_at_its_deadline():
    """A server asking again and again to come back in a second (429, Retry-After: 1)."""
    with FakeServer() as server:
        transport = Transport(server.url, max_retries=100, deadline=2.5)
        for _ in range(20):
            server.fail(429, '{"error": {"message": "busy"}}', {"Retry-After": "1"})
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"deadline of 2.5 s .*HTTP 429: busy"):
            transport.post("completions", {"prompt": "Hi", "max_tokens": 1})
        assert time.monotonic() - started < 15
        assert 2 <= len(server.posts()) <= 4
        transport.close()


def test_generation_requests_in_flight_are_bounded():
    """limit_in_flight (a llama.cpp server's slots): the rest wait here, untimed."""
    from concurrent.futures import ThreadPoolExecutor

    with FakeServer() as server:
        transport = Transport(server.url, timeout=0.6, max_retries=0)
        transport.limit_in_flight(2)
        server.delay = 0.4  # six requests of 0.4 s, two at a time: 1.2 s, each within its 0.6 s
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: transport.post("completions", {"prompt": "Hi", "seed": i}), range(6)))
        assert len(answers) == 6 and server.peak == 2
        transport.close()


def test_a_stream_of_keep_alive_comments_ends_at_the_deadline():
    """A server that opens the stream and then sends only SSE comments (`: keep-alive`), as a
    proxy in front of a stalled engine does: every read gets bytes, no chunk ever comes. The
    streamed call ends at its deadline (1 s here) instead of never (bounded by 30 s for a loaded
    machine)."""
    from metagen.remote import OpenAIGenerator
    from metagen.remote.streaming import stream
    from metagen.sampling import SamplingParams

    with FakeServer("vllm") as server, OpenAIGenerator(server.url, timeout=1.0, max_retries=0) as generator:
        assert generator.profile.model
        server.drip = 0.05
        pieces = []
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"the stream did not end within 1 s"):
            generator.loop.run(stream(generator, "Hi", SamplingParams(max_tokens=2), pieces.append))
        assert time.monotonic() - started < 30 and pieces == []
