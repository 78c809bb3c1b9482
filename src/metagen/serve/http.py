"""What the routers share: the server's state (`ServerState`, on `app.state.server`), the API-key
check (a dependency of every router but /health's) and reading a JSON body within its limit."""

from __future__ import annotations

import hmac
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import Request

from metagen.serve import metrics
from metagen.serve.backend import Backend
from metagen.serve.body import APIError, check_json_content_type, load_body


@dataclass(frozen=True)
class ServerState:
    """One application's settings and shared objects (`create_app`'s arguments).

    backend: the `Backend` (backend.py) requests are served over, a `LocalBackend` or a
    `ProxyBackend`; api_key: the
    bearer token every endpoint but /health needs (None: none); lenient: ignore unknown fields;
    max_body_bytes: the largest request body; request_timeout: seconds a request may take from
    its arrival (None: no limit); max_n: the bound on n and on every strategy option that counts
    work; counter: HTTP requests by route and status (/metrics); workers: the threads strategies
    run on; retriever: what the search strategies search (`metagen serve --retriever`; None: they
    are refused).
    """

    backend: Backend
    api_key: str | None
    lenient: bool
    max_body_bytes: int
    request_timeout: float | None
    max_n: int
    counter: metrics.RequestCounter
    workers: ThreadPoolExecutor
    retriever: str | None = None


def server(request: Request) -> ServerState:
    """The state of the application serving `request` (a dependency)."""
    return request.app.state.server


def check_key(request: Request) -> None:
    """401 unless the request carries `Authorization: Bearer <key>` (when the server has a key),
    compared in constant time (`hmac.compare_digest`)."""
    api_key = server(request).api_key
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
        raise APIError("missing or wrong API key (send Authorization: Bearer <key>)", None, status=401,
                       type="authentication_error", code="invalid_api_key")


async def read_json(request: Request) -> object:
    """The request's JSON body: 415 unless declared JSON, 413 past `max_body_bytes` (from the
    declared length, else while reading), 400 when not JSON or nested too deep (`load_body`)."""
    limit = server(request).max_body_bytes
    check_json_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(f"the request body has {declared} bytes, more than the limit of {limit}",
                       None, status=413, code="request_too_large")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise APIError(f"the request body is larger than the limit of {limit} bytes", None,
                           status=413, code="request_too_large")
    return load_body(bytes(body))
