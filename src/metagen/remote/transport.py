"""HTTP transport to an OpenAI-compatible server: one pooled `httpx.AsyncClient`, timeouts, retries.

    delay_k = max(Retry-After, uniform(0.5, 1) · min(max_backoff, backoff · 2^k))   (k = 0, 1, ...)
    attempt time <= min(timeout, deadline - elapsed)      (the whole answer, not each read)

Connection errors, timeouts, 429 and 5xx are retried up to `max_retries` times with exponential
backoff and jitter, never sooner than the server's `Retry-After`, and never past the call's
`deadline` (seconds for the whole call: attempts, waits and retries). `timeout` bounds one
attempt from sending to the answer's last byte, so a server dripping a byte a second cannot hold
a call longer. A `Retry-After` above `max_retry_after` (60 s, as openai-python caps it; a day, an
HTTP date in 2100) is not waited for: the call fails at once, so a fleet fails over. A timed-out
attempt is followed by a health check (GET /v1/models within `HEALTH_TIMEOUT`): a server that
answers it is alive but busy, and with `retry_busy` the attempt does not count against
`max_retries` (the deadline still bounds it); a fleet's endpoints set retry_busy=False and fail
such a request over to another endpoint at once (`ServerError.busy` says which it was).
Generation requests wait for one of `max_in_flight` places (`limit_in_flight`: a llama.cpp
server's slots, probed) before their timer starts: a request queued here is not a failing one,
and the server is never sent more than it can work on at once. The request body is sent
unchanged on every attempt (a fixed seed stays fixed, so a retried request gives the same
result). Other 4xx are permanent: raised at once (ValueError for 400 / 404 / 422, else
RuntimeError) with the server's own message. The API key is read from an environment variable
and appears in no message or repr.

Async underneath, with a synchronous face: `await transport.apost(path, body)` from async code
on any event loop, `transport.post(path, body)` from any thread, inside a running event loop too
(a notebook). Both run the request on the transport's `BackgroundLoop` (loop.py), the one loop
its client is used on (`sse.sse_chunks` reads a streamed answer on that loop); several
transports may share one (a fleet's endpoints). Requests in
flight at once share the client's connection pool; waiting for a free connection has no
timeout (the request and connect timeouts start once one is free).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import Awaitable, Callable

try:
    import httpx
except ImportError as error:  # every remote module speaks HTTP through this one first
    from metagen.extras import missing

    raise missing("remote", "metagen.remote (OpenAI-compatible servers)") from error

from metagen.decoding.errors import RequestFailedError
from metagen.remote.loop import BackgroundLoop

RETRIED_STATUS = {408, 409, 429} | set(range(500, 600))
INVALID_REQUEST_STATUS = {400, 404, 422}
MAX_RETRY_AFTER = 60.0  # seconds of Retry-After honoured at most (openai-python's cap)
HEALTH_TIMEOUT = 5.0  # seconds a health check (GET /v1/models) may take: a live server answers at once


class ServerError(RequestFailedError):
    """A request the server refused or failed, after any retries: status, URL, its message.
    busy: the server was alive but did not answer in time (its health check passed) or asked to
    be retried later (429 / 503 with Retry-After): slow, not dead."""

    def __init__(self, url: str, status: int | None, message: str, busy: bool = False) -> None:
        self.url, self.status, self.message, self.busy = url, status, message, busy
        where = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{url}: {where}: {message}")


class Unanswered(str):
    """A health check's failure that was no answer in time (not a refused connection or an error
    status): the server is hung, or too busy to answer."""

    unanswered = True


class InvalidRequestError(ServerError, ValueError):
    """The server rejected the request as invalid (400 / 404 / 422): its message names why."""


def server_message(response: httpx.Response) -> str:
    """The error text of a response: `error.message` (OpenAI), `message`, `detail`, else the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return json.dumps(body)[:500]


def retry_after_seconds(response: httpx.Response) -> float:
    """`Retry-After` as seconds (a number or an HTTP date; 0 when absent or unreadable)."""
    value = response.headers.get("retry-after")
    if not value:
        return 0.0
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(when.timestamp() - time.time(), 0.0)


class Transport:
    """JSON over HTTP to `base_url` (e.g. "http://127.0.0.1:8000/v1").

    timeout: seconds one attempt may take, from sending the request to the answer's last byte (a
        stream's too); connect_timeout: seconds to connect.
    deadline: seconds one call may take in all, retries and waits included (None: (max_retries +
        1) · timeout + max_retries · max_backoff, room for every attempt and wait).
    max_retry_after: a Retry-After above this many seconds fails the call at once.
    retry_busy: retry a busy server's timeouts and Retry-Afters without counting them against
        max_retries (False: count them; a fleet fails them over instead).
    api_key_env: environment variable holding the bearer token (absent: no Authorization header).
    max_connections: connections to the server at most (requests beyond wait for one).
    max_in_flight: generation requests in flight at most (beyond wait, untimed; see limit_in_flight).
    sleep: awaited between attempts (asyncio.sleep; tests record the delays instead).
    loop: the BackgroundLoop its requests run on (None: its own, closed with it).
    requests: HTTP requests that got a 2xx answer (retried attempts are not counted).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_connections: int = 100,
        deadline: float | None = None,
        max_retry_after: float = MAX_RETRY_AFTER,
        retry_busy: bool = True,
        max_in_flight: int | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        loop: BackgroundLoop | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r} must start with http:// or https://")
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries} is out of range: must be >= 0")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections={max_connections!r} is out of range: must be an int >= 1")
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout), ("deadline", deadline),
                            ("max_retry_after", max_retry_after)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} is out of range: must be > 0 seconds")
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self.timeout = timeout
        self.deadline = deadline if deadline is not None else (max_retries + 1) * timeout + max_retries * max_backoff
        self.max_retry_after, self.retry_busy = max_retry_after, retry_busy
        self.max_in_flight = max_in_flight or max(max_connections - 4, 1)  # room left for health checks
        self._gate: asyncio.Semaphore | None = None  # made on the loop, at the first request
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.requests = 0
        self.loop = loop if loop is not None else BackgroundLoop()
        self._owns_loop = loop is None
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout, pool=None),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def __repr__(self) -> str:  # never the key
        return f"Transport({self.base_url!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        """Close the connections (and the loop, when it is the transport's own)."""
        if self.loop.started:
            self.loop.run(self.aclose())
        if self._owns_loop:
            self.loop.close()

    async def aclose(self) -> None:
        """Close the connections (on the transport's loop; the loop stays)."""
        await self.loop.call(self._client.aclose())

    def get(self, path: str, *, retry: bool = True) -> dict:
        """The JSON answer to GET `path`; retry=False sends it once (health checks)."""
        return self.loop.run(self.aget(path, retry=retry))

    def post(self, path: str, body: dict, *, retry: bool = True, root: bool = False) -> dict:
        """The JSON answer to POST `body`; retry=False sends it once (probes); root: `path` is
        under the server's root, not its API version (vLLM's /pooling), retried alike."""
        return self.loop.run(self.apost(path, body, retry=retry, root=root))

    async def aget(self, path: str, *, retry: bool = True) -> dict:
        """`get` for async code (awaitable on any event loop)."""
        return await self.loop.call(self._send("GET", path, None, self.max_retries if retry else 0))

    async def apost(self, path: str, body: dict, *, retry: bool = True, root: bool = False) -> dict:
        """`post` for async code (awaitable on any event loop)."""
        return await self.loop.call(self._send("POST", path, body, self.max_retries if retry else 0, root))

    def limit_in_flight(self, count: int) -> None:
        """At most `count` generation requests in flight from now on (a server's slots)."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count={count!r} is out of range: must be an int >= 1")
        self.max_in_flight, self._gate = count, None

    def gate(self) -> asyncio.Semaphore:
        """The places of generation requests in flight (on the transport's loop)."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.max_in_flight)
        return self._gate

    async def alive(self) -> str | None:
        """None when the server answers GET /v1/models within HEALTH_TIMEOUT, else why not (an
        `Unanswered` when it gave no answer in time: hung, or too busy to answer)."""
        url = f"{self.base_url}/models"
        try:
            response = await asyncio.wait_for(self._client.get(url), HEALTH_TIMEOUT)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return Unanswered(f"GET {url}: no answer within {HEALTH_TIMEOUT:g} s")
        except httpx.TransportError as error:
            return f"GET {url}: {type(error).__name__}: {error}"
        if response.status_code >= 400:
            return f"GET {url}: HTTP {response.status_code}: {server_message(response)}"
        return None

    def retry_wait(self, url: str, response: httpx.Response) -> float:
        """Seconds to wait before retrying `response` per its Retry-After, or ServerError when the
        server asks for more than `max_retry_after` (not worth waiting for: fail, or fail over)."""
        wait = retry_after_seconds(response)
        if wait > self.max_retry_after:
            raise ServerError(url, response.status_code,
                              f"{server_message(response)} (Retry-After {wait:.0f} s is more than the "
                              f"{self.max_retry_after:g} s waited at most)", busy=True)
        return wait

    @property
    def root(self) -> str:
        """The server's root: `base_url` without its API version ("http://h:8000/v1" -> "http://h:8000"),
        where vLLM and metagen serve /tokenize and /detokenize."""
        head, _, last = self.base_url.rpartition("/")
        return head if last in ("v1", "v2") and "//" in head else self.base_url

    async def apost_root(self, path: str, body: dict) -> dict:
        """POST `body` once to `path` under the server's root (not under the API version)."""
        return await self.loop.call(self._root("POST", path, body))

    async def aget_root(self, path: str) -> dict:
        """GET `path` once under the server's root (llama.cpp's /props), within HEALTH_TIMEOUT."""
        return await self.loop.call(self._root("GET", path, None))

    async def _root(self, method: str, path: str, body: dict | None) -> dict:
        url = f"{self.root}/{path.lstrip('/')}"
        try:
            response = await asyncio.wait_for(self._client.request(method, url, json=body),
                                              HEALTH_TIMEOUT if method == "GET" else self.timeout)
        except asyncio.TimeoutError:
            raise ServerError(url, None, "no answer in time") from None
        except httpx.TransportError as error:
            raise ServerError(url, None, f"{type(error).__name__}: {error}") from None
        return self._decode(url, response)

    def _delay(self, attempt: int, floor: float) -> float:
        """The wait before retry `attempt`: the backoff, or the server's Retry-After `floor`
        (never more than max_retry_after)."""
        floor = min(floor, self.max_retry_after)
        return max(floor, self.rng.uniform(0.5, 1.0) * min(self.max_backoff, self.backoff * 2**attempt))

    async def _send(self, method: str, path: str, body: dict | None, max_retries: int, root: bool = False) -> dict:
        """The decoded JSON answer to one request, retrying what may succeed on a second try, within
        the deadline (see the module docstring). GETs are health checks and probes: not gated."""
        url = f"{self.root if root else self.base_url}/{path.lstrip('/')}"
        end: list[float] = []  # the deadline, set when the first attempt has its place
        failures = attempt = 0
        while True:
            try:
                response = await self._attempt(method, url, body, end)
            except ServerError as error:  # no answer in time, or none at all
                last = error.message
                busy = error.busy and self.retry_busy
                if not busy:
                    failures += 1
                if failures > max_retries or (busy and max_retries == 0):
                    raise
                wait = self._delay(attempt, 0.0)
            else:
                if response.status_code not in RETRIED_STATUS:
                    return self._decode(url, response)
                last = f"HTTP {response.status_code}: {server_message(response)}"
                wait = self.retry_wait(url, response)  # raises past max_retry_after
                busy = wait > 0 and self.retry_busy
                if not busy:
                    failures += 1
                if failures > max_retries or (busy and max_retries == 0):
                    return self._decode(url, response)  # raises with the server's message
                wait = self._delay(attempt, wait)
            if time.monotonic() + wait >= end[0]:
                raise ServerError(url, None, f"no answer within the call's deadline of {self.deadline:g} s "
                                             f"({attempt + 1} attempts; the last: {last})")
            attempt += 1
            await self.sleep(wait)

    async def _attempt(self, method: str, url: str, body: dict | None, end: list[float]) -> httpx.Response:
        """One attempt, whole, within min(timeout, end - now) seconds from when it may start (a
        generation request first waits for a place, untimed: the call's deadline `end[0]` is set
        when its first attempt has one); ServerError when no answer comes (busy when the server
        still answers its health check)."""
        async def send() -> httpx.Response:
            return await self._client.request(method, url, json=body)

        gate = self.gate() if method == "POST" else None
        if gate is not None:
            await gate.acquire()
        try:
            if not end:
                end.append(time.monotonic() + self.deadline)
            limit = min(self.timeout, end[0] - time.monotonic())
            try:
                return await asyncio.wait_for(send(), max(limit, 0.0))
            except asyncio.TimeoutError:
                reason = f"no complete answer within {limit:.3g} s"
            except httpx.TimeoutException as error:
                reason = f"{type(error).__name__}: {error}"
            except httpx.TransportError as error:  # connect / read errors
                raise ServerError(url, None, f"{type(error).__name__}: {error} (is the server running at this "
                                             "address?)") from None
        finally:
            if gate is not None:
                gate.release()
        if method == "GET":  # a health check's own timeout
            raise ServerError(url, None, reason)
        down = await self.alive()
        if down is None:
            raise ServerError(url, None, f"{reason} (the server answers its health check: busy, not down)", busy=True)
        raise ServerError(url, None, f"{reason}; health check: {down}")

    def _decode(self, url: str, response: httpx.Response) -> dict:
        status = response.status_code
        if status in INVALID_REQUEST_STATUS:
            raise InvalidRequestError(url, status, server_message(response))
        if status >= 400:
            raise ServerError(url, status, server_message(response))
        try:
            payload = response.json()
        except ValueError:
            raise ServerError(url, status, f"answer is not JSON: {response.text[:200]!r}") from None
        if not isinstance(payload, dict):
            raise ServerError(url, status, f"answer is not a JSON object: {response.text[:200]!r}")
        self.requests += 1
        return payload
