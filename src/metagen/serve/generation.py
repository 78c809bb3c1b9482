"""The generation router: POST /v1/completions and /v1/chat/completions over the app's backend.

A body is read and parsed (`parse_completion` or `parse_chat`); a strategy runs on a worker
thread over the backend's strategy generator (`_run_strategy`), a plain request is submitted to
the backend (`backend.submit`) and answered from its events: the whole answer, or Server-Sent
Events (`data: {chunk}` ... `data: [DONE]`). A stream starts with the request's first event, so
a request failing before any output (a backend down, a timeout in the queue) is answered with
its status rather than a 200 error chunk. A streaming client that goes away cancels its request
(the response generator is closed); a waiting non-streaming one is noticed within
`DISCONNECT_POLL` seconds. Either way its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from metagen.serve.body import APIError, ignored_fields_header
from metagen.serve.chat_request import parse_chat
from metagen.serve.completion_request import parse_completion
from metagen.serve.engine_generator import StrategyTimeout
from metagen.serve.http import ServerState, check_key, read_json, server
from metagen.serve.request_fields import field_named
from metagen.serve.requests import DoneEvent, ParsedRequest, TokenEvent
from metagen.serve.responses import ChunkWriter, full_response, strategy_response

DISCONNECT_POLL = 0.5  # seconds between checks that a waiting non-streaming client is still there

router = APIRouter(dependencies=[Depends(check_key)])


@router.post("/v1/completions")
async def completions(request: Request, state: ServerState = Depends(server)):
    return await _generate(request, state, parse_completion)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: ServerState = Depends(server)):
    return await _generate(request, state, parse_chat)


async def _generate(request: Request, state: ServerState, parse: Callable[..., ParsedRequest]):
    """Parse the body with the endpoint's `parse` (`parse_completion` or `parse_chat`); run its
    strategy, or submit it and answer from its events."""
    backend = state.backend
    body = await read_json(request)
    parsed = parse(body, model=backend.model, served_name=backend.served_name, max_rows=backend.max_rows,
                   lenient=state.lenient, max_n=state.max_n, retriever=state.retriever)
    headers = {"X-Metagen-Ignored-Fields": ignored_fields_header(parsed.ignored)} if parsed.ignored else {}
    if parsed.strategy is not None:
        return await _run_strategy(request, state, parsed, headers)
    backend.check(parsed)
    events: asyncio.Queue = asyncio.Queue()
    job = _submit(state, parsed, _emitter(events))
    event = await _next_event(request, job, events, done_only=not parsed.stream)
    if event is None:  # the client went away
        return JSONResponse({}, status_code=499)
    if parsed.stream and not (isinstance(event, DoneEvent) and event.error is not None):
        return StreamingResponse(_sse(parsed, job, events, backend.texts, event), media_type="text/event-stream",
                                 headers=headers)
    if event.timed_out:
        raise APIError(f"{event.error} (--request-timeout)", None, status=504, type="timeout",
                       code="request_timeout")
    if event.error is not None:
        raise _failed(event)
    return JSONResponse(full_response(parsed, job.completions, backend.texts, job.prompt_records, job.cached_tokens,
                                      event.usage), headers=headers)


def _emitter(events: asyncio.Queue):
    """The `emit` of one request: each event from the engine thread (or the fleet's loop) onto
    `events` on the server's loop."""
    loop = asyncio.get_running_loop()

    def emit(event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    return emit


def _submit(state: ServerState, parsed: ParsedRequest, emit):
    """`backend.submit`, its refusals answered: the backend's own mapping (a full queue 429, a
    stopped engine 503, backends down or failing), n past the rows 400 naming n."""
    backend = state.backend
    try:
        return backend.submit(parsed, emit, state.request_timeout)
    except Exception as error:  # noqa: BLE001 - a full queue, a stopped engine, n past the rows
        answer = backend.failure(error, parsed.params)
        if answer is not None:
            raise answer from None
        if isinstance(error, ValueError):
            raise APIError(str(error), "n") from None
        raise


async def _run_strategy(request: Request, state: ServerState, parsed: ParsedRequest, headers: dict[str, str]):
    """Run the request's strategy on a worker thread over the backend's strategy generator (an
    `EngineGenerator`, whose requests join the engine's batch, or the remote fleet's); the
    answer is the chosen output plus the `metagen` block."""
    backend, strategy = state.backend, parsed.strategy
    generator = backend.strategy_generator(parsed.chat, state.request_timeout)
    params = replace(parsed.params, n=1)
    try:
        strategy.spec.check(generator, strategy.options, params)
    except ValueError as error:
        raise APIError(str(error), "metagen.strategy", code="strategy_not_supported") from None
    rng = params.make_generator()
    loop = asyncio.get_running_loop()
    job = loop.run_in_executor(state.workers, lambda: strategy.spec.run(generator, parsed.prompt, strategy.n, params,
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
        raise _strategy_failure(backend, strategy.spec.name, error, params) from None
    return JSONResponse(strategy_response(parsed, result, generator, backend.texts), headers=headers)


def _strategy_failure(backend, name: str, error: Exception, params) -> APIError:
    """The answer to a strategy run that raised `error`: the backend's own mapping (busy, stopped,
    backends down or failing, refusing the request), a request past --request-timeout 504, a
    configuration the prompt or the backend cannot take 400 (naming the sampling field its message
    starts with, else metagen), anything else 500 naming the error (never a traceback)."""
    answer = backend.failure(error, params)
    if answer is not None:
        return answer
    if isinstance(error, StrategyTimeout):
        return APIError(f"{error} (--request-timeout)", None, status=504, type="timeout", code="request_timeout")
    if isinstance(error, ValueError):
        return APIError(f"strategy {name!r}: {error}", field_named(str(error)) or "metagen")
    return APIError(f"strategy {name!r} failed: {type(error).__name__}: {error}", None, status=500,
                    type="server_error")


def _failed(event: DoneEvent) -> APIError:
    """The answer to a plain request that ended with an error event: the status the backend gave
    (proxy mode: 502 / 503 for backends failing or down, 400 for one refusing the request), else 500."""
    status = event.status or 500
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return APIError(f"generation failed: {event.error}", event.param, status=status, type=kind, code=event.code)


def _retrieved(future) -> None:
    """Consume the outcome of a strategy whose client went away (no unretrieved-exception log)."""
    if not future.cancelled():
        future.exception()


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _next_event(request: Request, job, events: asyncio.Queue, done_only: bool):
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


async def _sse(parsed: ParsedRequest, job, events: asyncio.Queue, texts, first):
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
                                           "param": event.param, "code": code}})
                break
            assert isinstance(event, TokenEvent)
            generated += 1
            if not event.text and event.finish_reason is None and not parsed.logprobs:
                continue  # nothing to show yet (text held back by the detokenizer or a stop string)
            yield _data(writer.token(event.index, event.text, event.token_id, event.record, event.finish_reason,
                                     event.stop_reason if event.finish_reason else None))
        if parsed.include_usage:
            yield _data(writer.usage(*(event.usage or (len(parsed.prompt_ids), generated, job.cached_tokens))))
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            job.cancel()
