"""HTTP transport to an OpenAI-compatible server: one pooled `httpx.AsyncClient`, timeouts, retries.

    delay_k = max(Retry-After, uniform(0.5, 1) · min(max_backoff, backoff · 2^k))   (k = 0, 1, ...)

Connection errors, timeouts, 429 and 5xx are retried up to `max_retries` times with exponential
backoff and jitter, never sooner than the server's `Retry-After`. The request body is sent
unchanged on every attempt (a fixed seed stays fixed, so a retried request gives the same
result). Other 4xx are permanent: raised at once (ValueError for 400 / 404 / 422, else
RuntimeError) with the server's own message. The API key is read from an environment variable
and appears in no message or repr.

Async underneath, with a synchronous face: `await transport.apost(path, body)` from async code
on any event loop, `transport.post(path, body)` from any thread, inside a running event loop too
(a notebook). Both run the request on the transport's `BackgroundLoop` (loop.py), the one loop
its client is used on (`streaming.sse_chunks` reads a streamed answer on that loop); several
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

import httpx

from metagen.remote.loop import BackgroundLoop

RETRIED_STATUS = {408, 409, 429} | set(range(500, 600))
INVALID_REQUEST_STATUS = {400, 404, 422}


class ServerError(RuntimeError):
    """A request the server refused or failed, after any retries: status, URL, its message."""

    def __init__(self, url: str, status: int | None, message: str) -> None:
        self.url, self.status, self.message = url, status, message
        where = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{url}: {where}: {message}")


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

    timeout: seconds to wait for a response; connect_timeout: seconds to connect.
    api_key_env: environment variable holding the bearer token (absent: no Authorization header).
    max_connections: connections to the server at most (requests beyond wait for one).
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
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
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

    def post(self, path: str, body: dict, *, retry: bool = True) -> dict:
        """The JSON answer to POST `body`; retry=False sends it once (probes)."""
        return self.loop.run(self.apost(path, body, retry=retry))

    async def aget(self, path: str, *, retry: bool = True) -> dict:
        """`get` for async code (awaitable on any event loop)."""
        return await self.loop.call(self._send("GET", path, None, self.max_retries if retry else 0))

    async def apost(self, path: str, body: dict, *, retry: bool = True) -> dict:
        """`post` for async code (awaitable on any event loop)."""
        return await self.loop.call(self._send("POST", path, body, self.max_retries if retry else 0))

    @property
    def root(self) -> str:
        """The server's root: `base_url` without its API version ("http://h:8000/v1" -> "http://h:8000"),
        where vLLM and metagen serve /tokenize and /detokenize."""
        head, _, last = self.base_url.rpartition("/")
        return head if last in ("v1", "v2") and "//" in head else self.base_url

    async def apost_root(self, path: str, body: dict) -> dict:
        """POST `body` once to `path` under the server's root (not under the API version)."""
        async def send() -> dict:
            url = f"{self.root}/{path.lstrip('/')}"
            try:
                response = await self._client.post(url, json=body)
            except httpx.TransportError as error:
                raise ServerError(url, None, f"{type(error).__name__}: {error}") from None
            return self._decode(url, response)

        return await self.loop.call(send())

    def _delay(self, attempt: int, floor: float) -> float:
        return max(floor, self.rng.uniform(0.5, 1.0) * min(self.max_backoff, self.backoff * 2**attempt))

    async def _send(self, method: str, path: str, body: dict | None, max_retries: int) -> dict:
        """The decoded JSON answer to one request, retrying what may succeed on a second try."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        for attempt in range(max_retries + 1):
            last = attempt == max_retries
            try:
                response = await self._client.request(method, url, json=body)
            except httpx.TransportError as error:  # connect / read errors and timeouts
                if last:
                    raise ServerError(
                        url, None, f"{type(error).__name__}: {error} (after {attempt + 1} attempts; "
                        "is the server running at this address?)"
                    ) from None
                await self.sleep(self._delay(attempt, 0.0))
                continue
            if response.status_code in RETRIED_STATUS and not last:
                await self.sleep(self._delay(attempt, retry_after_seconds(response)))
                continue
            return self._decode(url, response)
        raise AssertionError("unreachable")

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
