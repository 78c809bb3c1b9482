"""Proxy mode (`metagen serve --backend URL [URL ...]`): remote OpenAI-compatible servers behind the app.

`ProxyBackend` is the other `Backend` of `create_app` (backend.py declares the contract): no local
model; a `FleetGenerator` over every URL (one URL too: one code path, with its health checks and
per-endpoint counts) sends the requests. The servers are probed at start (FleetUnavailableError
when none answers), so what they honour is known before the first request.

Plain requests are built by the remote generator exactly as `generate` builds them — the engine's
field table, its refusals by name (answered 400 before anything is sent, by `check`), n fanned
out over servers that ignore it — and sent to the live endpoint with the fewest requests in
flight, failing over to another while nothing has been answered (`fleet.py`). `stream: true`
streams from the backend (`remote/streaming.py`) and relays its pieces as the app's own chunks.
Strategies run over `ProxyGenerator` (proxy_generator.py), a per-run view of the same fleet.

Failures are answered, never hung on nor turned into tracebacks: every endpoint down 503
(`backend_unavailable`, naming each endpoint and its last failure), a backend failing or
answering nonsense 502 (`backend_error`, naming its URL; a request every backend fails with 500
is this: it takes no backend out, `fleet.py`), a backend refusing the request 400 with its own
message and URL. A refusal names the request's field in `param` as the request spelled it: the
remote generator's refusals by the field their message starts with, a backend's refusal of a
structured output by the constraint's field (`rejected_param`).

Bounds: `max_rows` is the most completions of one request in flight on the backends: a plain
request's n (checked at parse), and a strategy's calls, whose n is sent as requests of at most
max_rows choices (servers honouring n) or a fan-out of at most max_rows requests at once (servers
ignoring it), the next sent as one ends. Each backend has at most `max_concurrency_per_endpoint`
requests in flight (`--backend-concurrency`), fewer where it reports fewer slots (llama.cpp);
the rest wait in the proxy, untimed by the backend's timeout.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from metagen.decoding.result import Completion
from metagen.remote import FleetUnavailableError, InvalidRequestError, ServerError
from metagen.remote.streaming import stream, stream_request
from metagen.sampling import SamplingParams
from metagen.serve import metrics
from metagen.serve.backend import Backend
from metagen.serve.body import APIError, check_model, only
from metagen.serve.request_fields import field_named
from metagen.serve.requests import DoneEvent, EngineStats, Lifetime, ParsedRequest, TokenEvent

CANCEL_POLL = 0.25  # seconds between checks that a proxied request's client is still there
UNSUPPORTED_STATUS = (404, 405, 501)  # a backend without the endpoint
CONSTRAINT_WORDS = re.compile(r"schema|grammar|regex|choice|ebnf|structured_outputs|response_format",
                              re.IGNORECASE)  # a backend refusal about a structured output


def _param(message: str) -> str | None:
    """The request field a refusal of the remote generator is about: the field its message starts
    with, subfields included ("structured_outputs.regex is not supported by llama.cpp's server",
    "response_format.json_schema.schema needs ..."); the prompt or messages for refusals of the
    prompt's form."""
    field = field_named(message)
    if field is not None:
        return field
    if "token-id prompts" in message or message.startswith("prompt"):
        return "prompt"
    if "assistant message" in message:
        return "messages"
    return None


def rejected_param(params: SamplingParams, error: BaseException) -> str | None:
    """The request field a backend's refusal (HTTP 400 / 404 / 422) is about, as the request spelled
    it: the structured-output field (`StructuredOutputs.kind_field`: structured_outputs.json,
    response_format.json_schema.schema, ...) when the request has a constraint and the backend's
    message is about one (vLLM: "The provided JSON schema contains features not supported by
    xgrammar", "Invalid grammar specification"); else None: the backend's own field names are
    not the request's."""
    spec = params.structured_outputs
    if spec is None or not isinstance(error, InvalidRequestError) or not CONSTRAINT_WORDS.search(error.message):
        return None
    return spec.kind_field


def remote_failure(error: BaseException) -> tuple[int, str, str] | None:
    """(status, code, message) answering a failure of the remote generator, None for others."""
    if isinstance(error, FleetUnavailableError):
        return 503, "backend_unavailable", f"no backend can answer: {error}"
    if isinstance(error, InvalidRequestError):
        return 400, "backend_rejected", f"the backend refused the request: {error}"
    if isinstance(error, ServerError):
        return 502, "backend_error", f"the backend failed: {error}"
    return None


@dataclass
class ProxyRequest(Lifetime):
    """One plain request relayed to the backends: the prompt as the client sent it (text,
    messages or token ids: the backend encodes it), its params, whether the client streams
    (then the backend streams too, its pieces relayed as TokenEvents) and `emit`, as the engine's
    `ServeRequest`. `completions`: the backend's answer when not streamed. Usage comes in the
    DoneEvent, as the backends report it."""

    prompt: object
    params: SamplingParams
    emit: Callable[[object], None]
    stream: bool = False
    completions: list[Completion] = field(default_factory=list)
    prompt_records = None  # echo is refused in proxy mode
    cached_tokens = 0  # the backends' count is in the DoneEvent's usage


class ProxyBackend(Backend):
    """The app's backend over `remote` (a probed `FleetGenerator`): see the module docstring.

    served_name: the model id clients send (default: the id the backends serve); max_rows: most
    completions (n, or a pooled strategy's n) one request may ask for."""

    model = None
    texts = None

    def __init__(self, remote, *, served_name: str | None = None, max_rows: int = 16) -> None:
        self.remote, self.max_rows = remote, max_rows
        remote.max_rows = max_rows  # a strategy's n: at most max_rows in flight (module docstring)
        remote.chat = False  # a text prompt is a /v1/completions request's, relayed raw; chat ones come as messages
        self.profile = remote.profile  # probes every endpoint now
        self.served_name = served_name or self.profile.model
        self.stats = EngineStats()  # outcomes and tokens of proxied requests (plain and strategies' requests)
        self.backend_requests = 0  # requests sent to the backends (strategies make several)
        self._lock = threading.Lock()  # the fleet's loop and strategy threads both add usage

    def add_usage(self, cost) -> None:
        """Count what one backend request (or a strategy's) spent, from its Cost."""
        with self._lock:
            self.backend_requests += max(cost.model_calls, 1)
            self.stats.prompt_tokens += cost.prompt_tokens_computed + cost.prompt_tokens_reused
            self.stats.generated_tokens += cost.generated_tokens

    # --- plain requests -------------------------------------------------------------------------------
    def check(self, parsed) -> None:
        """400 for what the backends' engine cannot honour (the remote generator's refusals, by
        field), before the request starts (a stream's first chunk would commit to 200)."""
        try:
            stream_request(self.remote, parsed.prompt, parsed.params)
        except ValueError as error:
            raise APIError(f"{error} (backend {self.remote.where})", _param(str(error))) from None
        if parsed.include_usage and not self.profile.engine.streams_usage:
            raise APIError(f"stream_options.include_usage is not supported by this proxy's backends: "
                           f"{self.profile.engine.name}'s server reports no usage when streaming",
                           "stream_options.include_usage")

    def submit(self, parsed: ParsedRequest, emit: Callable[[object], None], timeout: float | None) -> ProxyRequest:
        """Start `parsed` on the fleet's event loop; its events come from there."""
        job = ProxyRequest(parsed.prompt, parsed.params, emit, stream=parsed.stream, timeout=timeout)
        self.remote.loop.submit(self._serve(job))
        return job

    async def _serve(self, job: ProxyRequest) -> None:
        """Run `job` until done, cancelled or past its deadline; always ends with one DoneEvent."""
        work = asyncio.ensure_future(self._generate(job))
        while True:
            done, _ = await asyncio.wait({work}, timeout=CANCEL_POLL)
            if done:
                break
            stopped = job.stopped(time.monotonic())  # the client went away, or past --request-timeout
            if stopped is not None:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                self.stats.count(stopped)
                job.emit(stopped)
                return
        try:
            usage = work.result()
        except Exception as error:  # noqa: BLE001 - every failure is answered
            mapped = remote_failure(error)
            param = rejected_param(job.params, error)
            if mapped is None and isinstance(error, ValueError):
                mapped, param = (400, None, str(error)), _param(str(error))
            status, code, message = mapped or (500, None, f"{type(error).__name__}: {error}")
            event = DoneEvent(message, status=status, code=code, param=param)
        else:
            event = DoneEvent(usage=usage)
        self.stats.count(event)
        job.emit(event)

    async def _generate(self, job: ProxyRequest) -> tuple[int, int, int] | None:
        """Send `job` (streaming its pieces as TokenEvents when the client streams); its usage."""
        params = job.params
        if job.stream:
            def piece(p) -> None:
                job.emit(TokenEvent(p.index, p.text, None, None, p.finish_reason, p.stop_reason))

            streamed = await stream(self.remote, job.prompt, params, piece)
            cost = streamed.cost
            self.add_usage(cost)
            if not streamed.usage_known:
                return None
        else:
            result = await self.remote._generate(job.prompt, params, None, text_only=True)
            job.completions = result.completions
            cost = result.cost
            self.add_usage(cost)
        return cost.prompt_tokens_computed + cost.prompt_tokens_reused, cost.generated_tokens, cost.prompt_tokens_reused

    # --- strategies ----------------------------------------------------------------------------------
    def strategy_generator(self, chat: bool, timeout: float | None):
        from metagen.serve.proxy_generator import ProxyGenerator

        return ProxyGenerator(self, chat=chat)

    def failure(self, error: BaseException, params: SamplingParams | None = None) -> APIError | None:
        mapped = remote_failure(error)
        if mapped is None:
            return None
        status, code, message = mapped
        param = rejected_param(params, error) if params is not None else None
        return APIError(message, param, status=status,
                        type="server_error" if status >= 500 else "invalid_request_error", code=code)

    # --- the other endpoints -------------------------------------------------------------------------
    async def health(self) -> tuple[int, dict]:
        """200 while some backend can take requests, else 503; each backend "up", or "down" or
        "suspect" (stalled: no new request, `pool.py`) with why. Each is health-checked now (GET
        /v1/models within HEALTH_TIMEOUT) and the fleet acts on the result as on its own checks
        (back in service when it answers, out when it does not), so what /health says is what the
        next request meets."""
        pool = self.remote.pool

        async def check_all() -> list[str | None]:
            return list(await asyncio.gather(*(pool.check(e) for e in self.remote.endpoints)))

        await self.remote.loop.call(check_all())
        backends = {e.url: (f"down: {e.last_failure}" if e.down_until is not None else
                            f"suspect: {e.suspect}" if e.suspect is not None else "up") for e in self.remote.endpoints}
        up = any(e.down_until is None for e in self.remote.endpoints)
        return (200 if up else 503), {"status": "ok" if up else "no backend answers", "backends": backends}

    def model_cards(self) -> list[dict]:
        profile = self.profile
        return [{"id": self.served_name, "object": "model", "created": 0, "owned_by": "metagen",
                 "max_model_len": profile.max_model_len, "root": profile.model, "backend_engine": profile.engine.name,
                 "backends": [e.url for e in self.remote.endpoints]}]

    async def tokenize(self, body: dict) -> dict:
        only(body, {"model", "prompt", "messages", "add_special_tokens"})
        return await self._forward_root("tokenize", body)

    async def detokenize(self, body: dict) -> dict:
        only(body, {"model", "tokens"})
        return await self._forward_root("detokenize", body)

    async def _forward_root(self, path: str, body: dict) -> dict:
        """POST `body` to the first live backend's /<path> (vLLM and metagen serve it at the
        server root); 501 naming the backend when it has no such endpoint."""
        check_model(body, self.served_name)
        body = {**body, "model": self.profile.model}
        live = [e for e in self.remote.endpoints if e.down_until is None] or self.remote.endpoints
        endpoint = live[0]
        try:
            return await endpoint.member.transport.apost_root(path, body)
        except ServerError as error:
            if error.status in UNSUPPORTED_STATUS:
                raise APIError(f"/{path} is not available in proxy mode with this backend: {error.url} answers HTTP "
                               f"{error.status} ({self.profile.engine.name}'s server has no /{path})", None,
                               status=501, type="server_error", code="not_supported") from None
            status, code, message = remote_failure(error)
            raise APIError(message, None, status=status, code=code,
                           type="server_error" if status >= 500 else "invalid_request_error") from None

    def metrics(self, counter) -> str:
        return metrics.render_proxy(self, counter)

    def close(self) -> None:
        self.remote.close()

