"""`FleetGenerator`: one `Generator` over several replicas of the same OpenAI-compatible server.

    FleetGenerator(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"], model="m",
                   max_concurrency_per_endpoint=8).generate(prompt, params) -> GenerationResult

Every endpoint is probed once (concurrently, on first use); the fleet honours what all of them
honour (the intersection of their profiles), and they must serve the same model with the same
engine. Requests go to the live endpoint with the fewest outstanding requests, at most
`max_concurrency_per_endpoint` in flight on each (see `pool.py`). Every request of the fleet is
a coroutine on its one event loop (`loop.py`), shared by its endpoints' transports: the fleet
may be called from any number of threads at once (`generate`) or awaited (`agenerate`), and a
fan-out (n requests to a server that ignores n) sends its requests at once (`asyncio.gather`),
so they spread over the endpoints.

Faults: a request that fails on an endpoint after the transport's retries (no connection,
timeout, 429 / 5xx) is sent again, unchanged (same seed, so the same answer), to another
endpoint, at most failures_to_eject · endpoints + 1 times, and never again to an endpoint that
answered it with an HTTP error (a 500 every replica gives is the request's own: it is raised,
502 in proxy mode); with no attempt left and no HTTP error, `FleetUnavailableError`. Only failures with no answer count towards
ejection (outlier detection, `pool.py`): `failures_to_eject` consecutive ones take an endpoint
out for `cooldown` seconds, never the last live one, then a health check (GET /v1/models within
HEALTH_TIMEOUT; the full probe if it was never probed) takes it back. Every `health_interval`
seconds the live endpoints are checked too (on the fleet's loop, from its first use until
`close()`; None: never), and one failing its check is taken out before a request fails on it, its
requests in flight sent to the others. An endpoint silent for `stall_seconds` on a request in flight
while the others answer (a server that accepts connections and answers nothing) gets no new
request until it answers again: a byte of an answer, or its health check, started at once
(passive stall detection, `pool.py`). The endpoints' transports do not retry a busy server
(`retry_busy=False`): a Retry-After or a timeout of a server that is alive fails over at once. A
request the server rejects as invalid (400 / 404 / 422) is raised at once: every replica would
say the same.

Bounds: at most `max_concurrency_per_endpoint` requests in flight on an endpoint, fewer where
the server says it works on fewer at once (llama.cpp's slots, probed); one call has
at most `max_rows` rows in flight (None: the fleet's capacity), the rest created as those end.

`Cost.model_calls` counts answered requests; `stats()` gives requests / failures / outstanding
per endpoint.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from metagen.remote.loop import BackgroundLoop, gather_all
from metagen.remote.openai_generator import OpenAIGenerator
from metagen.remote.pool import STALL_SECONDS, Endpoint, EndpointPool, FleetUnavailableError
from metagen.remote.probe import ServerProfile
from metagen.remote.transport import (
    RETRIED_STATUS,
    InvalidRequestError,
    ServerError,
    Transport,
)


def is_endpoint_failure(error: ServerError) -> bool:
    """Whether another endpoint may answer where this one failed (no answer, 429, 5xx)."""
    return not isinstance(error, InvalidRequestError) and (error.status is None or error.status in RETRIED_STATUS)


def common_profile(profiles: dict[str, ServerProfile]) -> ServerProfile:
    """What every endpoint honours, or ValueError when they serve different models or engines."""
    first = next(iter(profiles.values()))
    for url, profile in profiles.items():
        if (profile.model, profile.engine.name) != (first.model, first.engine.name):
            raise ValueError(f"fleet endpoints differ: {url} serves {profile.model!r} on {profile.engine.name}, "
                             f"{next(iter(profiles))} serves {first.model!r} on {first.engine.name}")
    lengths = [p.max_model_len for p in profiles.values() if p.max_model_len is not None]
    flags = ("native_n", "logprobs", "top_logprobs", "returns_token_ids", "token_prompts", "prompt_scoring")
    return replace(first, max_model_len=min(lengths) if lengths else None,
                   **{flag: all(getattr(p, flag) for p in profiles.values()) for flag in flags})


class FleetGenerator(OpenAIGenerator):
    """An `OpenAIGenerator` over several endpoints (replicas serving the same model).

    base_urls: the API roots, e.g. ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"].
    max_concurrency_per_endpoint: requests in flight on one endpoint at most.
    failures_to_eject: consecutive failed requests that take an endpoint out.
    cooldown: seconds an endpoint stays out before its health check.
    health_interval: seconds between health checks of the live endpoints (None: none; only
        endpoints taken out are checked, after their cool-down).
    stall_seconds: seconds without a byte on a request in flight, while other endpoints answer,
        after which an endpoint gets no new request until it answers again (None: never; see
        `pool.py`).
    deadline: seconds one request may take on one endpoint, its retries there included (see
        `Transport`; None: its default).
    Every other keyword is `OpenAIGenerator`'s, applied to each endpoint.
    """

    def __init__(self, base_urls: list[str], model: str | None = None, *, max_concurrency_per_endpoint: int = 4,
                 failures_to_eject: int = 2, cooldown: float = 30.0, health_interval: float | None = 30.0,
                 stall_seconds: float | None = STALL_SECONDS, engine: str = "auto",
                 chat: bool | None = None, tokenizer=None, parameter_count: float | None = None,
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, connect_timeout: float = 5.0,
                 max_retries: int = 4, deadline: float | None = None) -> None:
        if isinstance(base_urls, str) or not base_urls:
            raise ValueError(f"base_urls={base_urls!r} must be a non-empty list of URL strings")
        if len(set(base_urls)) != len(base_urls):
            raise ValueError(f"base_urls={base_urls!r} lists an endpoint twice")
        for name, value in (("max_concurrency_per_endpoint", max_concurrency_per_endpoint),
                            ("failures_to_eject", failures_to_eject)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is out of range: must be an int >= 1")
        if not cooldown >= 0:
            raise ValueError(f"cooldown={cooldown!r} is out of range: must be >= 0 seconds")
        if health_interval is not None and not health_interval > 0:
            raise ValueError(f"health_interval={health_interval!r} is out of range: must be > 0 seconds, "
                             "or None for no checks of live endpoints")
        if stall_seconds is not None and not 0 < stall_seconds < float("inf"):
            raise ValueError(f"stall_seconds={stall_seconds!r} is out of range: must be > 0 seconds, or None for no "
                             "stall detection")
        self.health_interval = health_interval
        self._watch: asyncio.Task | None = None  # the live health checks, once probed
        self._configure(model, engine, chat, tokenizer, parameter_count)
        self.loop = BackgroundLoop("metagen-fleet")  # one loop for every endpoint's requests
        members = [OpenAIGenerator(url, model, engine=engine, transport=Transport(
            url, api_key_env=api_key_env, timeout=timeout, connect_timeout=connect_timeout,
            max_retries=max_retries, deadline=deadline, retry_busy=False, loop=self.loop)) for url in base_urls]
        self.endpoints = [Endpoint(member.transport.base_url, member) for member in members]
        self.pool = EndpointPool(self.endpoints, max_concurrency=max_concurrency_per_endpoint,
                                 failures_to_eject=failures_to_eject, cooldown=cooldown,
                                 health_check=self._health_check, stall_seconds=stall_seconds)

    def __repr__(self) -> str:
        return f"FleetGenerator({[e.url for e in self.endpoints]!r}, model={self.requested_model!r})"

    @property
    def where(self) -> str:
        return f"fleet {[e.url for e in self.endpoints]}"

    def served_identity(self) -> dict:
        """The served model's id, the engine and every endpoint's base URL (probed on first use)."""
        profile = self.profile
        return {"name": profile.model, "engine": profile.engine.name, "base_urls": [e.url for e in self.endpoints]}

    def close(self) -> None:
        """Close every endpoint's connections and stop the fleet's event loop thread."""
        if self.loop.started:
            self.loop.run(self._shutdown())
        self.loop.close()

    async def _shutdown(self) -> None:
        """Stop the health checks (the live ones' and the suspects'), then close every endpoint's
        connections."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.pool.stop()
        await gather_all(endpoint.member.transport.aclose() for endpoint in self.endpoints)

    def stats(self) -> dict[str, dict]:
        """Per endpoint URL: requests answered, failures, outstanding, up, last failure."""
        return {e.url: e.stats() for e in self.endpoints}

    async def _probe(self) -> ServerProfile:
        """The intersection of every reachable endpoint's profile (each probed once, concurrently;
        one not answering its health check first is down, not waited for)."""
        async def attempt(endpoint: Endpoint) -> ServerProfile | ServerError:
            down = await endpoint.member.transport.alive()
            if down is not None:
                return ServerError(endpoint.url, None, down)
            try:
                profile = await endpoint.member._probed()
            except ServerError as error:  # unreachable or failing: down, not a capability answer
                return error
            endpoint.slots = profile.slots
            return profile

        answers = await asyncio.gather(*(attempt(endpoint) for endpoint in self.endpoints))
        outcomes = dict(zip([e.url for e in self.endpoints], answers))
        for endpoint in self.endpoints:
            if isinstance(outcomes[endpoint.url], ServerError):
                self.pool.take_down(endpoint, f"probe: {outcomes[endpoint.url]}")
        profiles = {url: p for url, p in outcomes.items() if isinstance(p, ServerProfile)}
        if not profiles:
            raise FleetUnavailableError(f"no endpoint of the fleet answered its probe: {self.pool.describe()}")
        joined = common_profile(profiles)
        if self.health_interval is not None:
            self._watch = asyncio.get_running_loop().create_task(self.pool.watch(self.health_interval))
        return joined

    async def _health_check(self, endpoint: Endpoint) -> str | None:
        """None when `endpoint` may serve again; an endpoint first probed now must honour what the
        fleet honours (else it stays out for good)."""
        down = await endpoint.member.transport.alive()
        if down is not None or endpoint.member._profile is not None:
            return down
        try:
            profile = await endpoint.member._probed()
            endpoint.slots = profile.slots
            reason = self._incompatibility(profile, endpoint.url)
        except ValueError as error:  # e.g. it does not serve the fleet's model
            reason = str(error)
        except ServerError as error:
            return str(error)
        if reason is not None:
            self.pool.take_down(endpoint, reason, forever=True)
        return reason

    def _incompatibility(self, profile: ServerProfile, url: str) -> str | None:
        """Why an endpoint with `profile` cannot join the fleet (None: it can; health checks run
        once the fleet is probed)."""
        try:
            joined = common_profile({self.where: self._profile, url: profile})
        except ValueError as error:
            return str(error)
        return None if joined == self._profile else f"{url} honours less than the fleet: {profile}"

    async def _post_all(self, endpoint: str, requests: list[dict]) -> list[tuple[dict, str]]:
        """(answer, URL that answered) per request, in order; a fan-out's go out as places free up
        (`_in_flight`: rows within max_rows, requests within the live endpoints' capacity)."""
        limit = self._in_flight(requests, self.pool.capacity())
        return await gather_all((self._post_one(endpoint, request) for request in requests), limit)

    async def _stream_one(self, path: str, request: dict, handle) -> None:
        """Stream one request from some live endpoint: failing over as `_post_one` does while no
        chunk has arrived; a stream that breaks after its first chunk raises (its text was passed on)."""
        started = False

        async def stream(endpoint, heard) -> None:
            nonlocal started
            started = False

            def relay(chunk: dict, url: str) -> None:  # the member passes the URL it streamed from
                nonlocal started
                started = True
                heard()
                handle(chunk, url)

            await endpoint.member._stream_one(path, request, relay)

        await self._on_some_endpoint(stream, retry=lambda: not started)

    async def _post_one(self, path: str, request: dict) -> tuple[dict, str]:
        """The answer to one request from some live endpoint, failing over to the others."""

        async def post(endpoint, heard) -> tuple[dict, str]:  # heard: the answer comes whole
            return await endpoint.member.transport.apost(path, request), f"{endpoint.url}/{path}"

        return await self._on_some_endpoint(post)

    async def _on_some_endpoint(self, run, retry=lambda: True):
        """`await run(endpoint, heard)` on a live endpoint, in the pool's order (heard(): a byte of
        the answer came, for stall detection, `pool.py`): an endpoint failure
        (`is_endpoint_failure`) is recorded (counted towards ejection when nothing answered, see
        `pool.py`) and the next pick is tried while `retry()` says so (never again an endpoint that
        answered with an HTTP error); any other error is the request's own and is raised at once."""
        tried: dict[int, int] = {}
        refused: set[int] = set()  # endpoints that answered it with an HTTP error
        last: ServerError | None = None
        for _ in range(self.pool.failures_to_eject * len(self.endpoints) + 1):
            endpoint = await self.pool.acquire(tried, frozenset(refused))
            if endpoint is None:  # every endpoint refused this request or is down
                break
            attempt = self._start(endpoint, run)
            try:
                await asyncio.wait({attempt})
            except BaseException:  # the caller went away
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                self.pool.release(endpoint, "interrupted", counted=False, recorded=False)
                raise
            finally:
                endpoint.attempts.pop(attempt, None)
            if attempt.cancelled():  # the endpoint was taken out while the request was in flight
                error = ServerError(endpoint.url, None, f"taken out while the request was in flight "
                                                        f"({endpoint.last_failure})")
                self.pool.release(endpoint, str(error), counted=False, recorded=False)
                if not retry():
                    raise error
            else:
                error = attempt.exception()
                if error is None:
                    self.pool.release(endpoint, None)
                    return attempt.result()
                if not isinstance(error, ServerError):
                    self.pool.release(endpoint, "interrupted", counted=False, recorded=False)
                    raise error
                if error.status is not None or error.busy:  # an answer came, or its health check's
                    self.pool.heard(endpoint)
                failed_here = is_endpoint_failure(error)
                self.pool.release(endpoint, str(error), counted=failed_here and error.status is None and not error.busy,
                                  recorded=failed_here)
                if not failed_here or not retry():
                    raise error
            last = error
            index = self.endpoints.index(endpoint)
            tried[index] = tried.get(index, 0) + 1
            if error.status is not None:
                refused.add(index)
        if last is not None and last.status is not None:
            raise last  # an HTTP error from the endpoints tried: the request's own
        raise FleetUnavailableError(f"the request failed on every endpoint of the fleet: {self.pool.describe()}")

    def _start(self, endpoint: Endpoint, run) -> asyncio.Future:
        """`run(endpoint, heard)` started as a request in flight on `endpoint`, silent from now until
        heard() records that a byte of its answer came."""
        def heard() -> None:
            self.pool.heard(endpoint, attempt)

        attempt = asyncio.ensure_future(run(endpoint, heard))
        endpoint.attempts[attempt] = self.pool.clock()
        return attempt
