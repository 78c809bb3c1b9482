"""Proxy mode under faults: a real `metagen serve --backend` (a subprocess) in front of scripted
fake servers (tests/remote/fake_server.py, in this process). Each fake reproduces one behaviour
of a real server, named in its test: one request must not take the proxy down. No model is
loaded: these run in seconds."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.remote.fake_server import FakeServer

from .server import serve_process


def _post(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _health(proxy, timeout: float = 30) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(proxy.url + "/health", timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _complete(proxy, **fields) -> tuple[int, dict]:
    return _post(proxy.url + "/v1/completions", {"model": "fake-model", "prompt": "Hi", "max_tokens": 2, **fields})


def test_a_request_every_backend_fails_takes_no_backend_out():
    """llama.cpp's server answers 500 to a request it cannot run (e.g. a grammar from a 3,000-string
    `choice`), on every replica alike: the proxy answers that request 502 with the backend's
    message, and every other request keeps being served; /health says so."""
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp") as b:
        for fake in (a, b):
            fake.reject(lambda body: body.get("max_tokens") == 7, 500, '{"error": {"message": "grammar too large"}}')
        with serve_process("--backend", a.url, b.url) as proxy:
            for _ in range(3):
                status, body = _complete(proxy, max_tokens=7)
                assert status == 502 and "grammar too large" in body["error"]["message"]
            assert max(sum(p.get("max_tokens") == 7 for p in f.posts()) for f in (a, b)) <= 6  # once each, retried once
            status, health = _health(proxy)
            assert status == 200 and health["backends"] == {a.url: "up", b.url: "up"}
            status, body = _complete(proxy)
            assert status == 200 and body["choices"]


def test_a_hanging_backend_is_taken_out_and_its_requests_fail_over():
    """A wedged backend (accepts connections, never answers, health checks included): the proxy's
    health check gives up after 5 s and takes it out, requests in flight on it go to the other
    backend, and /health names it down, instead of everything waiting the 600 s request timeout."""
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp") as b:
        with serve_process("--backend", a.url, b.url) as proxy:
            a.hang = True
            started = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda seed: _complete(proxy, seed=seed), range(4)))
            assert [status for status, _ in answers] == [200] * 4
            assert time.monotonic() - started < 60  # generous for a loaded machine; the timeout is 600 s
            status, health = _health(proxy)
            assert status == 200 and health["backends"][b.url] == "up"
            assert health["backends"][a.url].startswith("down") and "5 s" in health["backends"][a.url]


def test_a_day_long_retry_after_is_capped_and_failed_over():
    """A backend answering 429 with Retry-After: 86400 (a quota gateway): the request is answered by
    the other backend at once, not a day later."""
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp") as b:
        with serve_process("--backend", a.url, b.url) as proxy:
            for fake in (a, b):  # whichever gets the request first
                fake.fail(429, '{"error": {"message": "quota"}}', headers={"Retry-After": "86400"})
            status, body = _complete(proxy)
            assert status == 502 and "Retry-After 86400 s" in body["error"]["message"]  # both said it: named
            status, body = _complete(proxy, max_tokens=3)
            assert status == 200 and body["choices"]  # and both still serve


def test_max_rows_and_slots_bound_a_strategys_fan_out():
    """--max-rows 2: a strategy's n = 8 over a llama.cpp server (which ignores n, so 8 requests) has
    at most 2 in flight; a backend reporting 1 slot (GET /props) gets 1 at a time; /health answers
    meanwhile."""
    with FakeServer("llama.cpp") as fan:
        with serve_process("--backend", fan.url, "--max-rows", "2", "--backend-concurrency", "8") as proxy:
            fan.delay, fan.peak = 0.2, 0
            with ThreadPoolExecutor(1) as pool:
                running = pool.submit(_post, proxy.url + "/v1/chat/completions", {
                    "model": "fake-model", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2,
                    "seed": 1, "metagen": {"strategy": "self_consistency", "n": 8}})
                time.sleep(0.3)
                assert _health(proxy, timeout=10)[0] == 200
                status, body = running.result(timeout=120)
            assert status == 200, body
            assert fan.peak == 2 and len(fan.posts()) >= 8
    with FakeServer("llama.cpp") as single:
        single.slots = 1
        with serve_process("--backend", single.url) as proxy:
            single.delay, single.peak = 0.1, 0
            status, body = _complete(proxy, n=4)
            assert status == 200 and len(body["choices"]) == 4 and single.peak == 1


def test_engine_names_the_engine_of_a_backend_its_models_do_not_identify():
    """A gateway in front of vLLM: its /v1/models names no engine. Unnamed, the proxy serves it as
    the generic OpenAI shape, which has no top_k (400 naming it, nothing sent); --engine vllm
    sends vLLM's fields. A completion request's text is relayed raw, chat messages as chat."""
    with FakeServer("vllm", owned_by="gateway") as fake:
        with serve_process("--backend", fake.url) as proxy:
            assert json.loads(proxy.get("/v1/models"))["data"][0]["backend_engine"] == "openai"
            sent = len(fake.posts())
            status, body = _complete(proxy, top_k=5)
            assert status == 400 and "top_k=5 is not supported by openai's" in body["error"]["message"]
            assert len(fake.posts()) == sent
        with serve_process("--backend", fake.url, "--engine", "vllm") as proxy:
            assert json.loads(proxy.get("/v1/models"))["data"][0]["backend_engine"] == "vllm"
            status, body = _complete(proxy, top_k=5)
            path, request, _ = fake.requests[-1]
            assert status == 200 and path == "/v1/completions"
            assert request["prompt"] == "Hi" and request["top_k"] == 5
            status, body = _post(proxy.url + "/v1/chat/completions", {
                "model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            path, request, _ = fake.requests[-1]
            assert status == 200 and path == "/v1/chat/completions"
            assert request["messages"] == [{"role": "user", "content": "Hi"}]


def test_a_completion_request_is_relayed_raw_even_with_a_tokenizer_that_has_a_chat_template():
    from metagen.models import embedded_model_path

    with FakeServer("sglang") as fake, serve_process("--backend", fake.url, "--tokenizer",
                                                     str(embedded_model_path())) as proxy:
        status, body = _complete(proxy)
        path, request, _ = fake.requests[-1]
    assert status == 200 and body["choices"]
    assert path == "/v1/completions" and request["prompt"] == "Hi"
