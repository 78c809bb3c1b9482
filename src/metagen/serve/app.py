"""The HTTP face of a backend: a FastAPI application (the `serve` extra; imported only here).

    GET  /health                 200 {"status": "ok"} while the backend can generate (no API key)
    GET  /v1/models              the one served model (owned_by "metagen", max_model_len)
    POST /v1/completions         text or token-id prompt
    POST /v1/chat/completions    messages through the model's chat template
    POST /tokenize, /detokenize  the served tokenizer (vLLM's shapes)
    GET  /metrics                Prometheus text (metrics.py)

One router per endpoint group — health, info (models, metrics) and tokenizer in routers.py,
generation in generation.py — each reading the application's `ServerState` (http.py) from
`app.state.server`; every router but health's has the API-key check as its dependency. The
handlers are written once over a `Backend` (backend.py declares it): `LocalBackend`, the
engine thread over a local model, or `ProxyBackend` (proxy.py), remote servers through the
remote generator (`metagen serve --backend URL...`). Plain requests are jobs the backend runs,
answered from their events; strategies run on a worker thread over the backend's strategy
generator.

Bodies are read and checked by hand, not by a schema library, so that every refusal is OpenAI's
error body naming the field (body.py): a body not declared `application/json` is 415 (a web
page can post text/plain, form and multipart bodies anywhere without asking), one over
`max_body_bytes` 413, one that is not JSON or nests deeper than MAX_JSON_DEPTH 400, a full queue
429 with Retry-After. With an API key, every endpoint but /health needs
`Authorization: Bearer <key>`, compared in constant time (`hmac.compare_digest`).
/metrics counts requests by route (an unmatched path is "other"), so its series stay few.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from metagen.serve import metrics, routers
from metagen.serve.backend import Backend
from metagen.serve.body import DEFAULT_MAX_N, APIError
from metagen.serve.generation import router as generation
from metagen.serve.http import ServerState

# every router the app serves, in order; tests/serve/test_endpoints.py checks each route is documented
ROUTERS = (routers.health, routers.info, routers.tokenizer, generation)

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full context of text is far smaller


class _CountRequests:
    """Pure ASGI middleware counting answered requests by route and status (streams untouched):
    the path of the route the router matched (FastAPI leaves it in the scope; a known path with
    the wrong method too), else "other", so that the series stay as few as the routes."""

    def __init__(self, app, counter: metrics.RequestCounter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            self.counter.add(getattr(route, "path", None) or "other", status)


def create_app(backend: Backend, *, api_key: str | None = None, lenient: bool = False,
               max_body_bytes: int = MAX_BODY_BYTES, request_timeout: float | None = None,
               max_n: int = DEFAULT_MAX_N, retriever: str | None = None) -> FastAPI:
    """The application over `backend` (a `LocalBackend` over a started engine, or a `ProxyBackend`);
    `request_timeout`: seconds a request may take from its arrival (None: no limit), else 504 (or
    an error chunk when streaming); `max_n`: the bound on n and on every strategy option that
    counts work (`request_fields.parse_fields`); `retriever`: the spec of the corpus the search
    strategies search (built by the caller beforehand: `chain_programs.load_retriever`; None: those
    strategies are refused)."""
    app = FastAPI(title="metagen", docs_url=None, redoc_url=None, openapi_url=None)
    workers = ThreadPoolExecutor(max_workers=max(4, backend.max_rows), thread_name_prefix="metagen-strategy")
    app.state.server = ServerState(backend, api_key, lenient, max_body_bytes, request_timeout, max_n,
                                   metrics.RequestCounter(), workers, retriever)
    app.add_middleware(_CountRequests, counter=app.state.server.counter)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(Exception, _unexpected)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def _api_error(request: Request, error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    """A defect: answered in OpenAI's shape, no traceback."""
    answer = APIError(f"internal error: {type(error).__name__}: {error}", None, status=500, type="server_error")
    return JSONResponse(answer.body(), status_code=500)
