"""The async transport's two faces: `generate` (blocking, from any thread or from inside a running
event loop, as in a notebook) and `agenerate` (awaited), both running on the generator's own
event loop thread, which `close()` stops. Overlap is measured at the fake server (the most
requests it had in flight at once), not with wall-clock thresholds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("httpx")

from metagen.remote import FleetGenerator, OpenAIGenerator
from metagen.remote.loop import BackgroundLoop
from metagen.sampling import SamplingParams

from .fake_server import FakeServer

PARAMS = SamplingParams(max_tokens=3, seed=4)


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("metagen-")}


@pytest.fixture(autouse=True)
def no_thread_left():
    """Every loop thread a test starts is gone when it ends (closed by `with`)."""
    before = loop_threads()
    yield
    assert not loop_threads() - before, "a generator left its event loop thread running"


def test_the_sync_face_works_inside_a_running_event_loop():
    with FakeServer("vllm") as server, OpenAIGenerator(server.url) as gen:
        expected = gen.generate("Hi", PARAMS).text

        async def notebook_cell():
            asyncio.get_running_loop()  # a loop runs here: asyncio.run would be refused
            return gen.generate("Hi", PARAMS).text, gen.capabilities

        text, capabilities = asyncio.run(notebook_cell())
    assert text == expected and capabilities


def test_agenerate_is_awaited_and_concurrent_calls_overlap():
    with FakeServer("vllm") as server, OpenAIGenerator(server.url) as gen:
        expected = [gen.generate("Hi", SamplingParams(max_tokens=3, seed=s)).text for s in range(3)]
        server.delay, server.peak = 0.5, 0

        async def main():
            return await asyncio.gather(*(gen.agenerate("Hi", SamplingParams(max_tokens=3, seed=s))
                                          for s in range(3)))

        results = asyncio.run(main())
        assert [r.text for r in results] == expected
        assert server.peak == 3  # all three in flight at once


def test_a_fan_out_sends_its_requests_at_once():
    with FakeServer("llama.cpp") as server, OpenAIGenerator(server.url) as gen:
        assert not gen.profile.native_n  # n=4 becomes 4 requests
        server.delay, server.peak = 0.5, 0
        result = gen.generate("Hi", SamplingParams(n=4, max_tokens=3, seed=1))
        assert len(result.completions) == 4 and result.cost.model_calls == 4
        assert server.peak == 4
        again = asyncio.run(gen.agenerate("Hi", SamplingParams(n=4, max_tokens=3, seed=1)))
        assert [c.text for c in again.completions] == [c.text for c in result.completions]


def test_acontinue_prefix_equals_continue_prefix():
    with FakeServer("vllm") as server, OpenAIGenerator(server.url) as gen:
        params = SamplingParams(n=2, max_tokens=3, seed=8)
        awaited = asyncio.run(gen.acontinue_prefix("Once upon", params))
        blocking = gen.continue_prefix("Once upon", params)
        assert [c.text for c in awaited.completions] == [c.text for c in blocking.completions]
        assert server.posts()[-1]["prompt"] == "Once upon"


def test_sync_callers_on_many_threads_share_one_loop_thread():
    from concurrent.futures import ThreadPoolExecutor

    with FakeServer("vllm") as server, OpenAIGenerator(server.url) as gen:
        assert gen.profile
        server.delay, server.peak = 0.5, 0
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda s: gen.generate("Hi", SamplingParams(max_tokens=2, seed=s)).text, range(4)))
        assert len(texts) == 4 and server.peak == 4
        assert len([t for t in loop_threads() if t.name == gen.loop.name]) >= 1


def test_a_cancelled_await_frees_its_fleet_slot():
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp") as b, \
            FleetGenerator([a.url, b.url], max_retries=0) as fleet:
        assert fleet.profile.model
        a.delay = b.delay = 1.0

        async def impatient():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(fleet.agenerate("Hi", SamplingParams(n=2, max_tokens=2)), 0.2)

        asyncio.run(impatient())
        deadline = time.monotonic() + 5
        while any(s["outstanding"] for s in fleet.stats().values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s["outstanding"] for s in fleet.stats().values()] == [0, 0]
        assert all(s["up"] and s["failures"] == 0 for s in fleet.stats().values())  # not the servers' fault


def test_close_stops_the_loop_thread_and_later_calls_say_so():
    with FakeServer("vllm") as server:
        gen = OpenAIGenerator(server.url)
        assert not gen.loop.started  # no thread before the first request
        gen.generate("Hi", PARAMS)
        thread = next(t for t in loop_threads() if t.name == gen.loop.name)
        gen.close()
        assert not thread.is_alive()
        with pytest.raises(RuntimeError, match="was closed"):
            gen.generate("Hi", PARAMS)
        gen.close()  # twice is fine


def test_a_sync_call_from_the_loop_itself_is_refused_not_deadlocked():
    loop = BackgroundLoop("metagen-test")
    try:
        async def inner():
            return loop.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="would wait for itself"):
            loop.run(inner())
    finally:
        loop.close()


def test_an_unclosed_generator_lets_the_interpreter_exit():
    with FakeServer("vllm") as server:
        code = ("from metagen.remote import OpenAIGenerator\n"
                "from metagen.sampling import SamplingParams\n"
                f"gen = OpenAIGenerator({server.url!r})\n"
                "print(gen.generate('Hi', SamplingParams(max_tokens=2, seed=1)).text)\n")
        done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code],
                              check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "Traceback" not in done.stderr
