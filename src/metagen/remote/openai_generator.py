"""`OpenAIGenerator`: the `Generator` interface over any server speaking the OpenAI API.

    OpenAIGenerator("http://127.0.0.1:8000/v1").generate(prompt, params) -> GenerationResult

Prompts: text goes through the server's chat template (/v1/chat/completions, a user message)
by default, or to /v1/completions as it is with `chat=False` (a base model). The default
(`chat=None`) follows the model's template as `LocalGenerator`'s does: a supplied tokenizer says
whether the model has one (without a template: raw text), and without a tokenizer the server's
own is used, so an instruct model gets the prompt format it was trained on. Chat messages always
go to /v1/chat/completions; token ids go to /v1/completions as a list of ints where the server
accepts them (probed), else they are refused; `continue_prefix` always sends raw text.

n completions: one request with `n` where the server honours it, else n requests with distinct
seeds derived from one base seed (params.seed, or a draw from `generator`, or fresh entropy).
`max_rows` (None: no bound) bounds the rows of one call in flight: requests of at most max_rows
choices (seeds derived per request), at most max_rows of a fan-out sent at once (the next as one
ends); the transport's `max_in_flight` (the server's slots where it says) bounds them across calls.
Whatever is asked and cannot be delivered is refused before any request: a SamplingParams field
the engine does not honour, logprobs from a server that returns none, token prompts.

A final assistant message is continued by the server where the engine table says it can (vLLM,
SGLang); elsewhere it is rendered with the tokenizer's chat template and continued as raw text
on /v1/completions (ASSISTANT_CONTINUATION then needs that tokenizer). `stop_reason` names the
stop string that ended a completion: the engine's own field, else read from the sampled tokens'
text (`responses.stop_from_tokens`), as local decoding reports it.

Token ids: from the server (vLLM), else from `tokenizer` (the canonical tokenization of the
returned text), else None, meaning unknown; then `capabilities` lacks TOKEN_IDS, so strategies
that need ids refuse. `Cost`: model_calls = HTTP requests answered, prompt tokens computed vs
served from the server's prefix cache (`usage.prompt_tokens_details.cached_tokens`), generated
tokens, wall seconds, and FLOPs = 2 · parameter_count · tokens when `parameter_count` is given
(None, unknown, otherwise).

Faces: `generate` / `continue_prefix` block the calling thread (any thread, several at once, or
a notebook cell inside a running event loop); `agenerate` / `acontinue_prefix` are awaited from
async code on any event loop. Both run the same coroutine on the generator's own event loop
(`loop.py`), where a fan-out's requests go out at once (`asyncio.gather`). `close()` (or `with`)
stops that loop's thread; an unclosed one stops when the generator is collected or at exit.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import torch

from metagen.decoding.cost import Cost
from metagen.decoding.generator import Generator
from metagen.decoding.prompts import Prompt
from metagen.decoding.result import GenerationResult
from metagen.remote.constraints import constraint_fields
from metagen.remote.engines import sampling_fields
from metagen.remote.loop import gather_all
from metagen.remote.probe import ServerProfile, probe_async
from metagen.remote.prompt_fields import SEED_BITS, derived_seed, prompt_request
from metagen.remote.responses import (
    RemoteCompletion,
    parse_choices,
    stop_from_tokens,
    usage_cost,
)
from metagen.remote.transport import ServerError, Transport
from metagen.sampling import SamplingParams


LOGPROB_FIELDS = ("logprobs", "top_logprobs")


def text_body(body: dict, profile: ServerProfile, params: SamplingParams) -> dict:
    """`body` without the logprobs and token-id fields `_body` adds to fill `Completion.logprobs`,
    unless `params.logprobs` asks for them (stop_reason is then read from the engine's own field
    only, never from the sampled tokens' text)."""
    if params.logprobs is not None:
        return body
    return {key: value for key, value in body.items() if key not in LOGPROB_FIELDS + tuple(profile.engine.ids_request)}


class OpenAIGenerator(Generator):
    """A `Generator` over an OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI).

    base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
    model: the served model id (None: the only one the server lists).
    engine: a name of `ENGINES` ("vllm", "sglang", "llama.cpp", "openai", "metagen"), or "auto"
        (default): from /v1/models `owned_by`, else the generic "openai" table with a warning
        naming what it cannot do (`engines.limitations`).
    chat: text prompts through the server's chat template (/v1/chat/completions) or raw
        (/v1/completions); default None: the chat endpoint, unless `tokenizer` is given and has
        no chat template (see the module docstring).
    tokenizer: a metagen Tokenizer of the served model, for token ids the server does not return.
    parameter_count: the model's parameters, for FLOPs = 2 · params per token (None: unknown).
    api_key_env, timeout, connect_timeout, max_retries: see `Transport`.

    concurrent: `generate` may run from several threads at once (each call is a coroutine on the
    generator's one event loop; the probe runs once, before the first request).
    """

    concurrent = True

    def __init__(self, base_url: str, model: str | None = None, *, engine: str = "auto",
                 chat: bool | None = None, tokenizer=None, parameter_count: float | None = None,
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0,
                 connect_timeout: float = 5.0, max_retries: int = 4,
                 transport: Transport | None = None) -> None:
        self._configure(model, engine, chat, tokenizer, parameter_count)
        self.transport = transport or Transport(base_url, api_key_env=api_key_env, timeout=timeout,
                                                connect_timeout=connect_timeout, max_retries=max_retries)
        self.loop = self.transport.loop

    def _configure(self, model: str | None, engine: str, chat: bool | None, tokenizer,
                   parameter_count: float | None) -> None:
        """The settings shared with `FleetGenerator` (checked)."""
        if parameter_count is not None and not parameter_count > 0:
            raise ValueError(f"parameter_count={parameter_count!r} must be a positive number or None")
        self.requested_model, self.engine_name = model, engine
        self.chat = chat if chat is not None else (tokenizer is None or bool(tokenizer.chat_template))
        self.tokenizer = tokenizer
        self.parameter_count = parameter_count
        self.max_rows: int | None = None  # rows of one call in flight at most (module docstring)
        self._profile: ServerProfile | None = None
        self._probe_lock = asyncio.Lock()  # concurrent first calls probe once (on the generator's loop)

    def __repr__(self) -> str:
        return f"OpenAIGenerator({self.transport.base_url!r}, model={self.requested_model!r}, engine={self.engine_name!r})"

    @property
    def flops_estimate(self) -> str | None:
        """FLOPs = 2·N·(prompt tokens computed + generated tokens) from the server's usage, N the
        parameter count given: the layer and context shape is unknown, so the attention term
        is omitted (None without a parameter count: the FLOPs are unknown, not estimated)."""
        if self.parameter_count is None:
            return None
        return f"2·N·tokens with N={self.parameter_count:.4g} given, attention omitted"

    @property
    def where(self) -> str:
        """The server(s) named in refusals."""
        return self.transport.base_url

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> OpenAIGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def profile(self) -> ServerProfile:
        """What the server honours (probed on first use, then cached)."""
        return self._profile if self._profile is not None else self.loop.run(self._probed())

    async def _probed(self) -> ServerProfile:
        """The profile, probing once (later callers wait for the first one's probe)."""
        async with self._probe_lock:
            if self._profile is None:
                self._profile = await self._probe()
        return self._profile

    async def _probe(self) -> ServerProfile:
        return await probe_async(self.transport, self.requested_model, self.engine_name)

    @property
    def capabilities(self) -> frozenset[str]:
        return self.profile.capabilities(self.tokenizer is not None, self._has_template())

    def _has_template(self) -> bool:
        return self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None) is not None

    def served_identity(self) -> dict:
        """The served model's id, the engine and the base URL (probed on first use)."""
        profile = self.profile
        return {"name": profile.model, "engine": profile.engine.name, "base_urls": [self.transport.base_url]}

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise NotImplementedError("OpenAIGenerator decodes token ids only with a tokenizer= given")
        return self.tokenizer.decode(list(token_ids))

    def _body(self, profile: ServerProfile, endpoint: str, fields: dict, params: SamplingParams) -> dict:
        """The request body without n and seed, or ValueError for what the server cannot do."""
        if endpoint == "completions" and isinstance(fields["prompt"], list) and not profile.token_prompts:
            raise ValueError(f"{profile.engine.name} server at {self.where} does not accept "
                             "token-id prompts (probed): give text or chat messages")
        length = len(fields.get("prompt")) if isinstance(fields.get("prompt"), list) else 0
        if profile.max_model_len is not None and length >= profile.max_model_len:
            raise ValueError(f"prompt has {length} tokens, the served model's context is "
                             f"{profile.max_model_len}: no room to generate")
        if params.logprobs is not None and not profile.logprobs:
            raise ValueError(f"logprobs={params.logprobs} asked, but the server at "
                             f"{self.where} returns no logprobs (probed)")
        if params.logprobs and not profile.top_logprobs:
            raise ValueError(f"logprobs={params.logprobs} asks for top logprobs, which the server at "
                             f"{self.where} does not return (probed)")
        body = {"model": profile.model, **fields, **sampling_fields(params, profile.engine),
                **constraint_fields(params.structured_outputs, profile.engine.name, endpoint)}
        messages = fields.get("messages")
        if messages and messages[-1].get("role") == "assistant":
            if not profile.engine.continues_final_message:
                raise ValueError(f"messages end with an assistant message, which {profile.engine.name}'s "
                                 "server cannot continue (no continue_final_message): pass tokenizer= "
                                 "(--tokenizer PATH) with the model's chat template to render it as text")
            body.update(continue_final_message=True, add_generation_prompt=False)
        if profile.logprobs:  # always: Completion.logprobs is filled as in local decoding
            if endpoint == "completions":
                body["logprobs"] = params.logprobs or 0
            else:
                body.update(logprobs=True, top_logprobs=params.logprobs or 0)
            body.update(profile.engine.ids_request)
        return body

    def _requests(self, profile: ServerProfile, body: dict, params: SamplingParams,
                  generator: torch.Generator | None) -> list[tuple[dict, int]]:
        """(request body, choices expected) for the n completions: one request (n <= max_rows
        where the server honours n), requests of max_rows choices each, or a fan-out."""
        base = params.seed
        if generator is not None:
            base = int(torch.randint(0, 1 << SEED_BITS, (1,), generator=generator))
        rows = self.max_rows or params.n
        if params.n == 1 or (profile.native_n and params.n <= rows):
            seeded = body if base is None else {**body, "seed": base}
            return [({**seeded, "n": params.n}, params.n)]
        if profile.native_n:
            base = secrets.randbits(SEED_BITS) if base is None else base
            return [({**body, "n": min(rows, params.n - first), "seed": derived_seed(base, first // rows)},
                     min(rows, params.n - first)) for first in range(0, params.n, rows)]
        base = secrets.randbits(SEED_BITS) if base is None else base
        return [({**body, "n": 1, "seed": derived_seed(base, index)}, 1) for index in range(params.n)]

    def generate(self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None) -> GenerationResult:
        return self.loop.run(self._generate(prompt, params, generator))

    async def agenerate(self, prompt: Prompt, params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        """`generate` for async code: awaitable on any event loop (the requests run on the
        generator's own); many awaited at once run concurrently."""
        return await self.loop.call(self._generate(prompt, params, generator))

    async def _generate(self, prompt: Prompt, params: SamplingParams, generator: torch.Generator | None,
                        text_only: bool = False) -> GenerationResult:
        """`generate`; text_only: ask for no logprobs or ids beyond `params.logprobs` (proxy mode
        relays text only, and llama-cpp-python's server takes ~5x longer with logprobs on)."""
        endpoint, fields = prompt_request(prompt, self.chat)
        messages = fields.get("messages")
        final = bool(messages) and messages[-1].get("role") == "assistant"
        if final and not self._continues_final_message(await self._probed()):  # rendered here, continued as raw text
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=False,
                                                      continue_final_message=True)
            endpoint, fields = "completions", {"prompt": text}
        return await self._complete(endpoint, fields, params, generator, text_only)

    def _continues_final_message(self, profile: ServerProfile) -> bool:
        """The server continues a final assistant message itself (vLLM, SGLang: the engine
        table); else one is rendered with the tokenizer's chat template when one is given (else
        `_body` refuses)."""
        return profile.engine.continues_final_message or not self._has_template()

    def continue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        """Completions of `prefix` sent as it is to /v1/completions (raw text, never through the
        chat template; or token ids where the server takes them), for step searches."""
        return self.loop.run(self._continue_prefix(prefix, params, generator))

    async def acontinue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                               generator: torch.Generator | None = None) -> GenerationResult:
        """`continue_prefix` for async code (see `agenerate`)."""
        return await self.loop.call(self._continue_prefix(prefix, params, generator))

    async def _continue_prefix(self, prefix: str | list[int], params: SamplingParams,
                               generator: torch.Generator | None) -> GenerationResult:
        if isinstance(prefix, str) and not prefix:
            raise ValueError("prefix is empty: give at least one character or token")
        _, fields = prompt_request(prefix if isinstance(prefix, str) else list(prefix), chat=False)
        return await self._complete("completions", fields, params, generator)

    async def _complete(self, endpoint: str, fields: dict, params: SamplingParams,
                        generator: torch.Generator | None, text_only: bool = False) -> GenerationResult:
        start = time.perf_counter()
        profile = await self._probed()
        body = self._body(profile, endpoint, fields, params)
        if text_only:
            body = text_body(body, profile, params)
        chat = endpoint == "chat/completions"
        completions: list[RemoteCompletion] = []
        cost = Cost(flops=None if self.parameter_count is None else 0.0)
        requests = self._requests(profile, body, params, generator)
        answers = await self._post_all(endpoint, [request for request, _ in requests])
        for (_, expected), (answer, url) in zip(requests, answers):
            completions += parse_choices(answer, url, chat, params.logprobs, expected)
            cost += usage_cost(answer, url, self.parameter_count)
        for completion in completions:
            if completion.token_ids is None and self.tokenizer is not None:
                completion.token_ids = self.tokenizer.encode(completion.text, add_special_tokens=False)
            if completion.finish_reason == "stop" and completion.stop_reason is None:  # llama.cpp, OpenAI
                completion.stop_reason = stop_from_tokens(completion, params.stop)
            if params.structured_outputs is not None:  # the server ended it where its grammar accepts
                completion.complete = completion.finish_reason == "stop" and not isinstance(completion.stop_reason, str)
        cost.wall_seconds = time.perf_counter() - start
        prompt_ids = list(fields["prompt"]) if isinstance(fields.get("prompt"), list) else None
        return GenerationResult(completions, prompt_ids, cost, decode_seconds=cost.wall_seconds)

    async def _stream_one(self, endpoint: str, request: dict, handle) -> None:
        """Stream one request (`stream=true`), calling handle(chunk, URL) for every chunk."""
        from metagen.remote.sse import sse_chunks

        url = f"{self.transport.base_url}/{endpoint}"

        async def relay() -> None:
            async with self.transport.gate():  # a place on the server, untimed; then the deadline runs
                async for chunk in sse_chunks(self.transport, endpoint, request):
                    handle(chunk, url)

        try:  # the whole stream, keep-alive comments or not, within the transport's deadline
            await asyncio.wait_for(relay(), self.transport.deadline)
        except asyncio.TimeoutError:
            raise ServerError(url, None, f"the stream did not end within {self.transport.deadline:g} s") from None

    def _in_flight(self, requests: list[dict], capacity: int) -> int:
        """Requests of one call sent at once: as many as keep its rows in flight within max_rows
        (a request carries its `n` rows: requests of max_rows choices go one at a time), at most
        `capacity`, at least one."""
        if self.max_rows is None:
            return capacity
        widest = max((request.get("n", 1) for request in requests), default=1)
        return max(1, min(capacity, self.max_rows // widest))

    async def _post_all(self, endpoint: str, requests: list[dict]) -> list[tuple[dict, str]]:
        """(answer, URL that answered) for each request, in order; a fan-out's go out as places
        free up (`_in_flight` at once, within the transport's max_in_flight)."""
        url = f"{self.transport.base_url}/{endpoint}"
        limit = self._in_flight(requests, self.transport.max_in_flight)
        answers = await gather_all((self.transport.apost(endpoint, request) for request in requests), limit)
        return [(answer, url) for answer in answers]
