"""The HTTP face of a backend: a FastAPI application (the `serve` extra; imported only here).

    GET  /health                 200 {"status": "ok"} while the backend can generate (no API key)
    GET  /v1/models              the one served model (owned_by "metagen", max_model_len)
    POST /v1/completions         text or token-id prompt
    POST /v1/chat/completions    messages through the model's chat template
    POST /tokenize, /detokenize  the served tokenizer (vLLM's shapes)
    GET  /metrics                Prometheus text (metrics.py)

The handlers are written once over a backend (local.py lists its interface): `LocalBackend`, the
engine thread over a local model, or `ProxyBackend` (proxy.py), remote servers through the
remote generator (`metagen serve --backend URL...`). Plain requests are `ServeRequest`s the
backend runs, answered from their events; strategies run on a worker thread over the backend's
strategy generator.

Bodies are read and checked here, not by a schema library, so that every refusal is OpenAI's
error body naming the field (protocol.py): a body not declared `application/json` is 415 (a web
page can post text/plain, form and multipart bodies anywhere without asking), one over
`max_body_bytes` 413, one that is not JSON or nests deeper than MAX_JSON_DEPTH 400, a full queue
429 with Retry-After. With an API key, every endpoint but /health needs
`Authorization: Bearer <key>`, compared in constant time (`hmac.compare_digest`).
/metrics counts requests by route (an unmatched path is "other"), so its series stay few.

Streams are Server-Sent Events (`data: {chunk}` ... `data: [DONE]`). A streaming client that
goes away cancels its request (the response generator is closed); a waiting non-streaming one
is noticed within `DISCONNECT_POLL` seconds. Either way its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from metagen.serve import metrics
from metagen.serve.engine_generator import StrategyTimeout
from metagen.serve.protocol import (DEFAULT_MAX_N, APIError, ParsedRequest, check_json_content_type,
                                    ignored_fields_header, load_body, parse_request)
from metagen.serve.requests import DoneEvent, ServeRequest, TokenEvent
from metagen.serve.responses import ChunkWriter, full_response, strategy_response

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full context of text is far smaller
DISCONNECT_POLL = 0.5  # seconds between checks that a waiting non-streaming client is still there


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


def create_app(backend, *, api_key: str | None = None, lenient: bool = False,
               max_body_bytes: int = MAX_BODY_BYTES, request_timeout: float | None = None,
               max_n: int = DEFAULT_MAX_N) -> FastAPI:
    """The application over `backend` (a `LocalBackend` over a started engine, or a `ProxyBackend`);
    `request_timeout`: seconds a request may take from its arrival (None: no limit), else 504 (or
    an error chunk when streaming); `max_n`: the bound on n and on every strategy option that
    counts work (`parse_request`)."""
    app = FastAPI(title="metagen", docs_url=None, redoc_url=None, openapi_url=None)
    model, served_name, texts = backend.model, backend.served_name, backend.texts
    counter = metrics.RequestCounter()
    app.add_middleware(_CountRequests, counter=counter)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):  # a defect: answered in OpenAI's shape, no traceback
        answer = APIError(f"internal error: {type(error).__name__}: {error}", None, status=500, type="server_error")
        return JSONResponse(answer.body(), status_code=500)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
            raise APIError("missing or wrong API key (send Authorization: Bearer <key>)", None, status=401,
                           type="authentication_error", code="invalid_api_key")

    async def read_json(request: Request) -> object:
        check_json_content_type(request.headers.get("content-type"))
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise APIError(f"the request body has {declared} bytes, more than the limit of {max_body_bytes}",
                           None, status=413, code="request_too_large")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > max_body_bytes:
                raise APIError(f"the request body is larger than the limit of {max_body_bytes} bytes", None,
                               status=413, code="request_too_large")
        return load_body(bytes(body))

    @app.get("/health")
    async def health():
        status, body = await backend.health()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": backend.model_cards()}

    @app.get("/metrics")
    async def prometheus(request: Request):
        check_key(request)
        return PlainTextResponse(backend.metrics(counter), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        check_key(request)
        body = await read_json(request)
        if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
            raise APIError("give exactly one of prompt (text) or messages", "prompt")
        return await backend.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        check_key(request)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object", None)
        return await backend.detokenize(body)

    async def generate(request: Request, chat: bool):
        check_key(request)
        body = await read_json(request)
        parsed = parse_request(body, chat=chat, model=model, served_name=served_name, max_rows=backend.max_rows,
                               lenient=lenient, max_n=max_n)
        loop = asyncio.get_running_loop()
        headers = {"X-Metagen-Ignored-Fields": ignored_fields_header(parsed.ignored)} if parsed.ignored else {}
        if parsed.strategy is not None:
            return await run_strategy(request, parsed, chat, headers)
        backend.check(parsed)
        events: asyncio.Queue = asyncio.Queue()

        def emit(event) -> None:  # engine thread -> this request's queue on the server's loop
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

        job = ServeRequest(parsed.prompt_ids, parsed.params, emit, echo=parsed.echo_text is not None,
                           timeout=request_timeout, healed=parsed.healed, prompt=parsed.prompt, stream=parsed.stream)
        try:
            backend.submit(job)
        except Exception as error:  # noqa: BLE001 - a full queue, a stopped engine, n past the rows
            answer = backend.failure(error)
            if answer is not None:
                raise answer from None
            if isinstance(error, ValueError):
                raise APIError(str(error), "n") from None
            raise
        # A stream starts with its first event, so a request failing before any output (a backend
        # down, a timeout in the queue) is answered with its status rather than a 200 error chunk.
        event = await _next_event(request, job, events, done_only=not parsed.stream)
        if event is None:  # the client went away
            return JSONResponse({}, status_code=499)
        if parsed.stream and not (isinstance(event, DoneEvent) and event.error is not None):
            return StreamingResponse(_sse(parsed, job, events, texts, event), media_type="text/event-stream",
                                     headers=headers)
        if event.timed_out:
            raise APIError(f"{event.error} (--request-timeout)", None, status=504, type="timeout",
                           code="request_timeout")
        if event.error is not None:
            raise _failed(event)
        return JSONResponse(full_response(parsed, job.completions, texts, job.prompt_records, job.cached_tokens,
                                          event.usage), headers=headers)

    workers = ThreadPoolExecutor(max_workers=max(4, backend.max_rows), thread_name_prefix="metagen-strategy")

    async def run_strategy(request: Request, parsed: ParsedRequest, chat: bool, headers: dict[str, str]):
        """Run the request's strategy on a worker thread over the backend's strategy generator (an
        `EngineGenerator`, whose requests join the engine's batch, or the remote fleet's); the
        answer is the chosen output plus the `metagen` block."""
        from dataclasses import replace

        strategy = parsed.strategy
        generator = backend.strategy_generator(chat, request_timeout)
        params = replace(parsed.params, n=1)
        try:
            strategy.spec.check(generator, strategy.options, params)
        except ValueError as error:
            raise APIError(str(error), "metagen.strategy", code="strategy_not_supported") from None
        rng = params.make_generator()
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(workers, lambda: strategy.spec.run(generator, parsed.prompt, strategy.n, params,
                                                                      strategy.options, rng, strategy.overrides))
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=DISCONNECT_POLL)
                if done:
                    break
                if await request.is_disconnected():
                    generator.cancel()
                    job.add_done_callback(_retrieved)  # its StrategyCancelled has no one to go to
                    return JSONResponse({}, status_code=499)
            result = job.result()
        except asyncio.CancelledError:
            generator.cancel()
            job.add_done_callback(_retrieved)
            raise
        except Exception as error:  # noqa: BLE001 - answered, the server stays up
            raise _strategy_failure(backend, strategy.spec.name, error) from None
        return JSONResponse(strategy_response(parsed, result, generator, texts), headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


def _strategy_failure(backend, name: str, error: Exception) -> APIError:
    """The answer to a strategy run that raised `error`: the backend's own mapping (busy, stopped,
    backends down or failing), a request past --request-timeout 504, a configuration the prompt
    cannot take 400, anything else 500 naming the error (never a traceback)."""
    answer = backend.failure(error)
    if answer is not None:
        return answer
    if isinstance(error, StrategyTimeout):
        return APIError(f"{error} (--request-timeout)", None, status=504, type="timeout", code="request_timeout")
    if isinstance(error, ValueError):
        return APIError(f"strategy {name!r}: {error}", "metagen")
    return APIError(f"strategy {name!r} failed: {type(error).__name__}: {error}", None, status=500,
                    type="server_error")


def _failed(event: DoneEvent) -> APIError:
    """The answer to a plain request that ended with an error event: the status the backend gave
    (proxy mode: 502 / 503 for backends failing or down, 400 for one refusing the request), else 500."""
    status = event.status or 500
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return APIError(f"generation failed: {event.error}", None, status=status, type=kind, code=event.code)


def _retrieved(future) -> None:
    """Consume the outcome of a strategy whose client went away (no unretrieved-exception log)."""
    if not future.cancelled():
        future.exception()


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _next_event(request: Request, job: ServeRequest, events: asyncio.Queue, done_only: bool):
    """The request's next event (its DoneEvent when `done_only`), or None when the client went away
    (noticed within DISCONNECT_POLL seconds; the job is cancelled)."""
    loop = asyncio.get_running_loop()
    try:
        checked = loop.time()
        while True:
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                event = None
            if event is not None and (isinstance(event, DoneEvent) or not done_only):
                return event
            if loop.time() - checked >= DISCONNECT_POLL:  # tokens keep coming: check by the clock
                checked = loop.time()
                if await request.is_disconnected():
                    job.cancel()
                    return None
    except asyncio.CancelledError:
        job.cancel()
        raise


async def _sse(parsed: ParsedRequest, job: ServeRequest, events: asyncio.Queue, texts, first):
    """The request's events, from `first`, as SSE chunks; closing the generator (client gone)
    cancels the job."""
    writer = ChunkWriter(parsed, texts)
    done = False
    generated = 0
    try:
        if parsed.chat:
            yield _data(writer.roles())
        while True:
            event, first = (first, None) if first is not None else (await events.get(), None)
            if isinstance(event, DoneEvent):
                done = True
                if event.error is not None:
                    kind, code = ("timeout", "request_timeout") if event.timed_out else (_failed(event).type, event.code)
                    yield _data({"error": {"message": f"generation failed: {event.error}", "type": kind,
                                           "param": None, "code": code}})
                break
            assert isinstance(event, TokenEvent)
            generated += 1
            if not event.text and event.finish_reason is None and not parsed.logprobs:
                continue  # nothing to show yet (text held back by the detokenizer or a stop string)
            stop_reason = None
            if event.finish_reason:  # a backend's piece names its stop; an engine row knows it
                stop_reason = event.stop_reason if event.record is None else job.rows[event.index].completion.stop_reason
            yield _data(writer.token(event.index, event.text, event.token_id, event.record, event.finish_reason,
                                     stop_reason))
        if parsed.include_usage:
            yield _data(writer.usage(*(event.usage or (len(parsed.prompt_ids), generated, job.cached_tokens))))
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            job.cancel()
