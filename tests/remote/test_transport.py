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
