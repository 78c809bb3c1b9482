"""FleetGenerator: balancing, concurrency, failover and health checks over several endpoints.

Fast tests run on the scripted fake server (faults it scripts, timing it controls) behind the
fault proxy; slow tests run on two real llama.cpp replicas over the embedded model, faults
injected by the proxy in front of one of them, and one replica killed mid-run (the last test:
it ends the module's second replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

pytest.importorskip("httpx")

from metagen.remote import (
    FleetGenerator,
    FleetUnavailableError,
    InvalidRequestError,
    OpenAIGenerator,
    ServerError,
)
from metagen.sampling import SamplingParams

from .conftest import free_port, start_llama_server, stop
from .fake_server import FakeServer
from .proxy import FaultProxy

PROMPT = "The capital of France is"


def origin(url: str) -> str:
    return url.removesuffix("/v1")


@pytest.fixture
def fakes():
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp") as b:
        yield a, b


# fake servers ------------------------------------------------------------------------------


def test_fan_out_spreads_over_endpoints_and_overlaps(fakes):
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_retries=0) as fleet:
        assert fleet.profile.model  # probe first: the probe's requests would take the delays
        for server in fakes:
            server.delay, server.peak = 0.5, 0  # each answer held 0.5 s: requests sent at once overlap
        result = fleet.generate("hi", SamplingParams(n=4, max_tokens=3, seed=1))
        assert len(result.completions) == 4 and result.cost.model_calls == 4
        assert [server.peak for server in fakes] == [2, 2]  # both of each server's requests in flight at once
        assert [s["requests"] for s in fleet.stats().values()] == [2, 2]
        seeds = sorted(body["seed"] for server in fakes for body in server.posts()[-2:])
        assert len(set(seeds)) == 4  # distinct derived seeds, one per request


def test_concurrent_callers_respect_the_per_endpoint_limit(fakes):
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_concurrency_per_endpoint=1, max_retries=0) as fleet:
        assert fleet.profile.model
        for server in fakes:
            server.delay, server.peak = 0.05, 0
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda i: fleet.generate("hi", SamplingParams(max_tokens=2, seed=i)), range(12)))
        assert all(len(r.completions) == 1 for r in results)
        assert [server.peak for server in fakes] == [1, 1]
        counts = [s["requests"] for s in fleet.stats().values()]
        assert sum(counts) == 12 and min(counts) >= 4, counts
        assert all(s["outstanding"] == 0 for s in fleet.stats().values())


def test_429_with_retry_after_fails_over_and_invalid_requests_do_not(fakes):
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_retries=0) as fleet:
        assert fleet.profile.model
        a.fail(429, '{"error": {"message": "slow down"}}', headers={"Retry-After": "30"})
        result = fleet.generate("hi", SamplingParams(max_tokens=2, seed=5))
        assert result.cost.model_calls == 1
        assert a.posts()[-1] == b.posts()[-1]  # the same body, seed included, sent to b
        assert fleet.stats()[a.url]["failures"] == 1 and "HTTP 429" in fleet.stats()[a.url]["last_failure"]
        a.fail(400, '{"error": {"message": "max_tokens too large"}}')
        with pytest.raises(InvalidRequestError, match="max_tokens too large"):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=5))
        assert fleet.stats()[a.url]["failures"] == 1 and fleet.stats()[a.url]["up"]  # not the endpoint's fault


def test_a_dead_endpoint_is_taken_out_then_health_checked_back(fakes):
    a, b = fakes
    with FaultProxy(origin(a.url)) as proxy, \
            FleetGenerator([proxy.url, b.url], max_retries=0, failures_to_eject=2, cooldown=0.3) as fleet:
        assert fleet.profile.model
        proxy.down = True
        for seed in range(4):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))
        stats = fleet.stats()[proxy.url]
        assert not stats["up"] and stats["failures"] == 2  # out after 2, then no more tries
        seen = proxy.seen
        fleet.generate("hi", SamplingParams(max_tokens=2))
        assert proxy.seen == seen  # still cooling down: not even a health check
        proxy.down = False
        time.sleep(0.35)
        for seed in range(4):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))
        stats = fleet.stats()[proxy.url]
        assert stats["up"] and stats["requests"] >= 1


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def model_listings(server: FakeServer) -> int:
    return [path for path, _, _ in server.requests].count("/v1/models")


def test_a_live_endpoint_failing_its_health_check_is_out_before_a_request_fails(fakes):
    a, b = fakes
    with FaultProxy(origin(a.url)) as proxy, \
            FleetGenerator([proxy.url, b.url], max_retries=0, cooldown=60, health_interval=0.05) as fleet:
        assert fleet.profile.model
        proxy.down = True  # the replica dies while the fleet is idle
        assert wait_for(lambda: not fleet.stats()[proxy.url]["up"]), "the live health check did not take it out"
        stats = fleet.stats()[proxy.url]
        assert stats["failures"] == 0 and stats["last_failure"].startswith("health check")
        posts = len(a.posts())
        for seed in range(4):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))
        assert len(a.posts()) == posts and fleet.stats()[b.url]["requests"] == 4  # none sent to the dead one
        assert fleet.stats()[proxy.url]["failures"] == 0


def test_live_health_checks_stop_on_close_and_do_not_run_without_an_interval(fakes):
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_retries=0, health_interval=0.05) as fleet:
        assert fleet.profile.model
        listed = model_listings(a)
        assert wait_for(lambda: model_listings(a) >= listed + 2)  # checked again and again
        assert fleet.stats()[a.url]["up"] and fleet.stats()[a.url]["requests"] == 0  # checks are not requests
    listed = model_listings(a)
    time.sleep(0.3)
    assert model_listings(a) == listed  # closed: no more checks

    async def background_tasks():
        return len(asyncio.all_tasks()) - 1  # besides this one

    with FleetGenerator([a.url, b.url], max_retries=0, health_interval=None) as fleet:
        assert fleet.profile.model
        assert fleet.loop.run(background_tasks()) == 0
        listed = model_listings(a)
        time.sleep(0.3)
        assert model_listings(a) == listed


def test_an_endpoint_unreachable_at_start_is_out_and_the_rest_serve(fakes):
    a, _ = fakes
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    with FleetGenerator([nowhere, a.url], max_retries=0, cooldown=60) as fleet:
        assert fleet.generate("hi", SamplingParams(max_tokens=2)).cost.model_calls == 1
        stats = fleet.stats()
        assert not stats[nowhere]["up"] and "probe" in stats[nowhere]["last_failure"]


@pytest.mark.parametrize("model", [None, "fake-model"])
def test_an_endpoint_back_with_another_model_stays_out(model):
    with FakeServer("llama.cpp") as a, FakeServer("llama.cpp", model="other") as b, \
            FaultProxy(origin(b.url)) as proxy, \
            FleetGenerator([a.url, proxy.url], model, max_retries=0, cooldown=0) as fleet:
        proxy.down = True
        assert fleet.profile.model == "fake-model"  # b out: it did not answer its probe
        proxy.down = False
        for seed in range(3):  # b is probed now, found serving "other", and kept out
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))
        stats = fleet.stats()[proxy.url]
        assert not stats["up"] and stats["requests"] == 0 and "other" in stats["last_failure"]
        assert not b.posts() or all(body.get("max_tokens") == 1 for body in b.posts())  # probes only


def test_every_endpoint_gone_names_each_and_its_failure(fakes):
    a, b = fakes
    with FaultProxy(origin(a.url)) as pa, FaultProxy(origin(b.url)) as pb, \
            FleetGenerator([pa.url, pb.url], max_retries=0, failures_to_eject=1, cooldown=60) as fleet:
        assert fleet.profile.model
        pa.down = pb.down = True
        with pytest.raises(FleetUnavailableError) as error:
            fleet.generate("hi", SamplingParams(max_tokens=2))
        message = str(error.value)
        assert pa.url in message and pb.url in message and message.count("disconnected") == 2


def test_endpoints_serving_different_models_are_refused():
    with FakeServer("llama.cpp", model="m1") as a, FakeServer("llama.cpp", model="m2") as b, \
            FleetGenerator([a.url, b.url]) as fleet, pytest.raises(ValueError, match="endpoints differ"):
        assert fleet.profile.model


def test_capabilities_are_the_intersection():
    with FakeServer("vllm") as a, FakeServer("vllm", logprobs=False) as b, \
            FleetGenerator([a.url, b.url]) as fleet:
        assert fleet.profile.native_n and not fleet.profile.logprobs
        with pytest.raises(ValueError, match="returns no logprobs"):
            fleet.generate("hi", SamplingParams(logprobs=1))


@pytest.mark.parametrize("urls, options, wrong", [
    ("http://127.0.0.1:1/v1", {}, "base_urls="),
    ([], {}, "base_urls="),
    (["http://127.0.0.1:1/v1"] * 2, {}, "twice"),
    (["ftp://x/v1"], {}, "http://"),
    (["http://127.0.0.1:1/v1"], {"max_concurrency_per_endpoint": 0}, "max_concurrency_per_endpoint=0"),
    (["http://127.0.0.1:1/v1"], {"failures_to_eject": 0}, "failures_to_eject=0"),
    (["http://127.0.0.1:1/v1"], {"cooldown": -1}, "cooldown=-1"),
    (["http://127.0.0.1:1/v1"], {"health_interval": 0}, "health_interval=0 is out of range"),
    (["http://127.0.0.1:1/v1"], {"stall_seconds": 0}, "stall_seconds=0 is out of range"),
    (["http://127.0.0.1:1/v1"], {"stall_seconds": float("nan")}, "stall_seconds=nan is out of range"),
])
def test_bad_settings_are_named(urls, options, wrong):
    with pytest.raises(ValueError, match=wrong):
        FleetGenerator(urls, **options)


# faults one request, or one endpoint, must not turn into an outage ----------------------------


def test_a_request_every_endpoint_fails_with_500_takes_none_out(fakes):
    """llama.cpp answers 500 to a request it cannot run (a grammar built from a 3,000-string
    `choice`): every replica does the same. It is tried once on each, raised as the server's own
    error, and takes no endpoint out."""
    a, b = fakes
    for server in fakes:
        server.reject(lambda body: body.get("max_tokens") == 7, 500, '{"error": {"message": "grammar too large"}}')
    with FleetGenerator([a.url, b.url], max_retries=0, failures_to_eject=1, cooldown=60) as fleet:
        assert fleet.profile.model
        with pytest.raises(ServerError, match="grammar too large") as raised:
            fleet.generate("hi", SamplingParams(max_tokens=7))
        assert not isinstance(raised.value, FleetUnavailableError) and raised.value.status == 500
        assert [sum(p.get("max_tokens") == 7 for p in s.posts()) for s in fakes] == [1, 1]  # once on each
        assert all(s["up"] for s in fleet.stats().values())
        assert fleet.generate("hi", SamplingParams(max_tokens=2)).cost.model_calls == 1  # others still served


def test_the_last_live_endpoint_is_never_ejected_by_request_failures(fakes):
    """Connection drops on the only endpoint left (a fault proxy): each request fails, the endpoint
    stays in service, so the next request is answered instead of 503 for the cool-down."""
    a, _ = fakes
    with FaultProxy(origin(a.url)) as proxy, \
            FleetGenerator([proxy.url], max_retries=0, failures_to_eject=1, cooldown=60) as fleet:
        assert fleet.profile.model
        proxy.fault("drop")
        proxy.fault("drop")  # the request's two attempts (failures_to_eject · 1 + 1)
        with pytest.raises(FleetUnavailableError, match="disconnected"):
            fleet.generate("hi", SamplingParams(max_tokens=2))
        assert fleet.stats()[proxy.url]["up"]
        assert fleet.generate("hi", SamplingParams(max_tokens=2)).cost.model_calls == 1


def test_a_hanging_endpoint_is_taken_out_and_its_requests_fail_over(fakes):
    """A wedged replica (accepts connections, answers nothing, health checks included): its health
    check times out (HEALTH_TIMEOUT, 5 s), it is taken out and the requests in flight on it go to
    the other replica, long before their own 120 s timeout."""
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_retries=0, health_interval=0.2, timeout=120) as fleet:
        assert fleet.profile.model
        a.hang = True
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda s: fleet.generate("hi", SamplingParams(max_tokens=2, seed=s)), range(4)))
        assert all(r.completions for r in results)
        assert time.monotonic() - started < 60  # health check and failover, not the 120 s timeout
        stats = fleet.stats()
        assert not stats[a.url]["up"] and "health check" in stats[a.url]["last_failure"]
        assert stats[b.url]["requests"] == 4


def test_an_endpoint_answering_requests_but_not_its_health_check_in_time_is_busy_not_out(fakes):
    """llama-cpp-python's server generating on a loaded machine answers GET /v1/models in over 5 s
    (seen in tests/serve/test_proxy.py's fleets): while it keeps answering requests it stays in."""
    a, b = fakes
    with FleetGenerator([a.url, b.url], max_retries=0, health_interval=0.2) as fleet:
        assert fleet.profile.model
        for seed in range(2):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))  # one to each
        a.models_delay = 8.0
        assert wait_for(lambda: "busy, kept" in (fleet.stats()[a.url]["last_failure"] or ""), 30)
        assert fleet.stats()[a.url]["up"]


class SilentRelay:
    """A TCP server on 127.0.0.1 (a free port) relaying each connection to `upstream` (a fake
    server) until `silence()`: from then on it accepts connections and reads what comes but
    passes nothing on, so nothing is ever answered, on the connections it holds too (a wedged
    process behind an open socket); `resume()` passes on what it held and relays again."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream).port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.relaying = threading.Event()
        self.relaying.set()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def silence(self) -> None:
        self.relaying.clear()

    def resume(self) -> None:
        self.relaying.set()

    def __enter__(self) -> SilentRelay:
        self.threads[0].start()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # the accept loop ends
        self.listener.close()
        self.relaying.set()
        for sock in list(self.sockets):  # every pump's recv returns
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            thread.join(timeout=10)
        assert not any(thread.is_alive() for thread in self.threads)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                pump = threading.Thread(target=self._pump, args=(source, target), daemon=True)
                self.threads.append(pump)
                pump.start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.relaying.wait()  # silenced: the bytes are held here
                target.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


@pytest.fixture
def relayed(fakes):
    """(relay in front of fake a, fake a, fake b)."""
    a, b = fakes
    with SilentRelay(a.url) as relay:
        yield relay, a, b


def test_a_backend_gone_silent_gets_no_new_request_after_stall_seconds_and_rejoins_when_it_answers(relayed):
    """The first replica's socket stays open but nothing comes back. Once its request in flight
    has been silent for stall_seconds while the other replica answered, new requests all go to
    the other one (long before that request's timeout, with no live health checks); answering its
    health check again brings it back."""
    relay, a, b = relayed
    with FleetGenerator([relay.url, b.url], max_retries=0, stall_seconds=0.5, health_interval=None,
                        timeout=20) as fleet:
        silent = fleet.pool.endpoints[0]
        for seed in range(2):
            fleet.generate("hi", SamplingParams(max_tokens=2, seed=seed))  # one to each
        relay.silence()
        hung = fleet.loop.submit(fleet.agenerate("hi", SamplingParams(max_tokens=2, seed=2)))
        assert wait_for(lambda: silent.outstanding == 1)  # sent to the silent one (ties go to the first)
        fleet.generate("hi", SamplingParams(max_tokens=2, seed=3))  # the other answers meanwhile
        time.sleep(0.6)
        sent, answered = silent.sent, len(b.posts())
        with ThreadPoolExecutor(10) as pool:
            results = list(pool.map(lambda s: fleet.generate("hi", SamplingParams(max_tokens=2, seed=s)),
                                    range(10, 20)))
        assert all(r.completions for r in results)
        assert silent.sent == sent and len(b.posts()) == answered + 10  # 10 of 10 to the answering one
        stats = fleet.stats()[relay.url]
        assert stats["up"] and stats["suspect"].startswith("stalled") and stats["outstanding"] == 1
        hung.cancel()
        assert wait_for(lambda: silent.outstanding == 0)
        assert fleet.stats()[relay.url]["suspect"]  # nothing came from it: still suspect
        listed = model_listings(a)
        relay.resume()  # its health check (started when it was found stalled) is answered now
        assert wait_for(lambda: fleet.stats()[relay.url]["suspect"] is None, 5)
        assert model_listings(a) > listed and not fleet.stats()[relay.url]["failures"]
        posts = len(a.posts())
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(lambda s: fleet.generate("hi", SamplingParams(max_tokens=2, seed=s)).completions,
                                range(20, 24)))
        assert len(a.posts()) > posts  # serving again


def test_a_day_long_retry_after_fails_over_at_once(fakes):
    """429 with Retry-After: 86400 (a quota gateway in front of vLLM): not slept on; the other
    replica answers the request at once."""
    a, b = fakes
    with ThreadPoolExecutor(1) as pool, FleetGenerator([a.url, b.url], max_retries=2) as fleet:  # closed first
        fleet.pool.endpoints[1].sent = 1  # the first request goes to a (ties go to the one given fewest)
        assert fleet.profile.model
        a.fail(429, '{"error": {"message": "quota"}}', headers={"Retry-After": "86400"})
        result = pool.submit(fleet.generate, "hi", SamplingParams(max_tokens=2)).result(timeout=30)
        assert result.completions and not a.faults
        assert fleet.stats()[a.url]["up"] and "Retry-After 86400 s" in fleet.stats()[a.url]["last_failure"]


def test_a_servers_slots_bound_its_requests_in_flight():
    """llama.cpp's server reports `total_slots` at GET /props: a fan-out sends it no more at once
    (the rest wait in the client, untimed, instead of timing out in the server's queue)."""
    with FakeServer("llama.cpp") as one:
        one.slots = 1
        with FleetGenerator([one.url], max_retries=0, max_concurrency_per_endpoint=4) as fleet:
            assert fleet.profile.slots == 1 and fleet.stats()[one.url]["slots"] == 1
            one.delay, one.peak = 0.1, 0
            result = fleet.generate("hi", SamplingParams(n=4, max_tokens=2, seed=1))
            assert len(result.completions) == 4 and one.peak == 1
        with OpenAIGenerator(one.url, max_retries=0) as single:
            one.peak = 0
            assert len(single.generate("hi", SamplingParams(n=3, max_tokens=2, seed=1)).completions) == 3
            assert single.profile.slots == 1 and one.peak == 1


def test_max_rows_bounds_one_calls_fan_out_and_native_n():
    with FakeServer("llama.cpp") as fan, FakeServer("vllm") as native:
        with FleetGenerator([fan.url], max_retries=0, max_concurrency_per_endpoint=8) as fleet:
            fleet.max_rows = 2
            assert fleet.profile.model
            fan.delay, fan.peak = 0.1, 0
            result = fleet.generate("hi", SamplingParams(n=6, max_tokens=2, seed=1))
            assert len(result.completions) == 6 and fan.peak == 2
        with FleetGenerator([native.url], max_retries=0) as fleet:
            fleet.max_rows = 2
            assert fleet.profile.native_n
            native.delay, native.peak = 0.1, 0
            result = fleet.generate("hi", SamplingParams(n=5, max_tokens=2, seed=1))
            sent = [body for body in native.posts() if body.get("max_tokens") == 2]
            assert [body["n"] for body in sent] == [2, 2, 1] and len({body["seed"] for body in sent}) == 3
            assert len(result.completions) == 5
            assert native.peak == 1  # requests of 2 rows go one at a time: 2 rows in flight at most


def test_gather_all_with_a_limit_runs_and_creates_that_many_at_once():
    from metagen.remote.loop import gather_all

    finished = running = peak = 0

    async def one(index):
        nonlocal running, peak, finished
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        running -= 1
        finished += 1
        return index

    def make():
        for index in range(1000):
            assert index - finished <= 3  # made only when a place is free: never 1000 at once
            yield one(index)

    assert asyncio.run(gather_all(make(), limit=3)) == list(range(1000)) and peak == 3


# two real llama.cpp replicas ---------------------------------------------------------------


@pytest.fixture(scope="module")
def second_server(tmp_path_factory):
    """(process, URL) of a second replica; the last test of this module kills it."""
    process, url = start_llama_server(tmp_path_factory.mktemp("llama_replica"))
    try:
        yield process, url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def replicas(llama_server, second_server):
    return [llama_server, second_server[1]]


@pytest.fixture(scope="module")
def reference(replicas):
    """The seeded texts each replica gives alone (seed -> text); the replicas must agree."""
    texts = {}
    for url in replicas:
        with OpenAIGenerator(url, max_retries=0) as single:
            texts[url] = {seed: single.generate(PROMPT, SamplingParams(max_tokens=6, seed=seed)).text
                          for seed in range(3)}
    first, second = texts.values()
    assert first == second, "replicas serving the same file disagree on seeded samples"
    return first


@pytest.mark.slow
def test_replicas_balance_and_agree(replicas, reference):
    with FleetGenerator(replicas, max_retries=0) as fleet, ThreadPoolExecutor(4) as pool:
        seeds = [i % 3 for i in range(8)]
        results = list(pool.map(lambda s: fleet.generate(PROMPT, SamplingParams(max_tokens=6, seed=s)), seeds))
        assert [r.text for r in results] == [reference[s] for s in seeds]
        counts = [s["requests"] for s in fleet.stats().values()]
        assert sum(counts) == 8 and min(counts) >= 2, counts
        fanned = fleet.generate(PROMPT, SamplingParams(n=4, max_tokens=6, seed=9))
        assert fanned.cost.model_calls == 4 and len({c.text for c in fanned.completions}) > 1


@pytest.mark.slow
@pytest.mark.parametrize("kind, options", [
    ("drop", {}),
    ("status", {"status": 500}),
    ("status", {"status": 429, "headers": {"Retry-After": "0"}}),
    ("delay", {"seconds": 20.0}),
])
def test_a_fault_on_one_replica_is_answered_by_the_other(replicas, reference, kind, options):
    # the timeout is far above a 6-token answer's time on a loaded machine (so only the fault
    # fails) and far below the delay fault's
    with FaultProxy(origin(replicas[0])) as proxy, \
            FleetGenerator([proxy.url, replicas[1]], max_retries=0, timeout=10.0) as fleet:
        assert fleet.profile.model
        proxy.fault(kind, **options)
        result = fleet.generate(PROMPT, SamplingParams(max_tokens=6, seed=1))
        assert result.text == reference[1] and result.cost.model_calls == 1
        assert not proxy.faults  # the fault was met, by the first choice
        stats = fleet.stats()
        assert stats[proxy.url]["failures"] == 1 and stats[replicas[1]]["requests"] == 1


@pytest.mark.slow
def test_a_replica_killed_mid_run_leaves_the_work_to_the_other(replicas, reference, second_server):
    process, url = second_server
    with FleetGenerator([url, replicas[0]], max_retries=1, cooldown=60) as fleet, ThreadPoolExecutor(4) as pool:
        assert fleet.profile.model
        seeds = [i % 3 for i in range(8)]
        futures = [pool.submit(fleet.generate, PROMPT, SamplingParams(max_tokens=6, seed=s)) for s in seeds]
        deadline = time.monotonic() + 30
        while fleet.stats()[url]["requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fleet.stats()[url]["outstanding"] > 0  # requests in flight on the replica we kill
        process.kill()  # a crash, not a graceful shutdown that would finish what is in flight
        process.wait()
        results = [future.result(timeout=120) for future in futures]
        assert [r.text for r in results] == [reference[s] for s in seeds]
        stats = fleet.stats()
        assert not stats[url]["up"] and stats[url]["failures"] >= 1
        assert stats[url]["requests"] + stats[replicas[0]]["requests"] == 8
