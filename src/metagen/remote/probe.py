"""What a server honours, found out with a few one-token requests on first use.

    /v1/models                        -> model id (checked: a server serving another model, or
                                         one ignoring the `model` field, is refused), engine
                                         (`owned_by`; none known: the generic "openai" table, with
                                         a warning), max_model_len where listed (vLLM)
    prompt="Hello", n=2, logprobs=1   -> native n (llama.cpp's server silently answers with
                                         one choice), logprobs, top logprobs, returned token ids
    prompt=[token ids]                -> token-id prompts (a 4xx answer means no)
    echo=True, logprobs=1             -> prompt scoring (the prompt's own logprobs come back)
    GET /props (server root)          -> slots: requests the server works on at once (llama.cpp's
                                         `total_slots`; None where /props is absent: vLLM, SGLang,
                                         llama-cpp-python), the most a client should have in flight

Nothing is assumed from the engine's name alone: the table in `engines.py` says which request
fields to send; the probe says what actually comes back. `probe_async` runs on the transport's
loop (the generators await it); `probe` is its synchronous face.
"""

from __future__ import annotations

from dataclasses import dataclass

from metagen.decoding import capabilities as caps
from metagen.remote.constraints import supported_kinds
from metagen.remote.engines import Engine, detect_engine, engine_named
from metagen.remote.responses import token_id
from metagen.remote.transport import InvalidRequestError, ServerError, Transport


@dataclass(frozen=True)
class ServerProfile:
    """What one server (engine + model) was found to do."""

    engine: Engine
    model: str
    max_model_len: int | None
    native_n: bool
    logprobs: bool
    top_logprobs: bool
    returns_token_ids: bool
    token_prompts: bool
    prompt_scoring: bool
    completions: bool = True  # /v1/completions answers (a chat-only model does not)
    slots: int | None = None  # requests worked on at once (llama.cpp /props total_slots); None: not said

    @property
    def tells_stops(self) -> bool:
        """A completion tells which stop ended it: the engine reports the matched stop string
        (vLLM `stop_reason`, SGLang `matched_stop`), or logprobs list the sampled tokens, whose
        text runs past the cut text into the stop string (llama.cpp, OpenAI)."""
        return self.engine.names_stop or self.logprobs

    def capabilities(self, has_tokenizer: bool, has_template: bool = False) -> frozenset[str]:
        """What a generator over this server provides, with a tokenizer of the served model (and
        one with a chat template: a final assistant message is then rendered as text and
        continued on /v1/completions where the engine cannot continue it itself)."""
        names = set()
        if self.logprobs:
            names.add(caps.LOGPROBS)
        if self.top_logprobs and self.returns_token_ids:  # top logprobs keyed by token id
            names.add(caps.TOP_LOGPROBS)
        if self.returns_token_ids or has_tokenizer:
            names.add(caps.TOKEN_IDS)
        if self.token_prompts:
            names.add(caps.TOKEN_PROMPTS)
        if self.prompt_scoring:
            names.add(caps.PROMPT_SCORING)
        if self.completions and self.tells_stops:
            names.add(caps.STEP_CONTINUATION)
        if self.tells_stops and (self.engine.continues_final_message or (has_template and self.completions)):
            names.add(caps.ASSISTANT_CONTINUATION)
        if supported_kinds(self.engine.name):  # which kinds: remote/constraints.py refuses the others
            names.add(caps.STRUCTURED_OUTPUT)
        return frozenset(names)


async def served_model(transport: Transport, model: str | None, engine: str) -> tuple[str, Engine, int | None]:
    """(model id, engine, max_model_len) from /v1/models, or ValueError naming what is served."""
    listing = (await transport.aget("models")).get("data")
    if not isinstance(listing, list) or not listing:
        raise ValueError(f"{transport.base_url}/models lists no models")
    ids = [str(entry.get("id")) for entry in listing]
    if model is None:
        if len(ids) > 1:
            raise ValueError(f"{transport.base_url} serves {len(ids)} models {ids}: pass model= one of them "
                             "(--served-model NAME on the command line)")
        model = ids[0]
    if model not in ids:
        raise ValueError(f"model={model!r} is not served by {transport.base_url}: it serves {ids}")
    entry = listing[ids.index(model)]
    found = detect_engine(listing, transport.base_url) if engine == "auto" else engine_named(engine)
    length = entry.get("max_model_len")
    return model, found, length if isinstance(length, int) else None


async def server_slots(transport: Transport) -> int | None:
    """The server's `total_slots` (llama.cpp's GET /props), None when it does not say."""
    try:
        props = await transport.aget_root("props")
    except ServerError:  # absent (404) or not answering in time: unknown
        return None
    slots = props.get("total_slots")
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1 else None


async def _try(transport: Transport, body: dict) -> dict | None:
    """The answer to a probe request (sent once), None when the server answers with an error:
    llama-cpp-python answers a request it cannot parse with HTTP 500, so any error status means
    "not supported" here (a flaky server can only make the profile more conservative)."""
    try:
        return await transport.apost("completions", body, retry=False)
    except ServerError as error:
        if error.status is None:  # unreachable: not a capability question
            raise
        return None


def probe(transport: Transport, model: str | None = None, engine: str = "auto") -> ServerProfile:
    """Probe the server at `transport` (/v1/models, then 3 one-token requests)."""
    return transport.loop.run(probe_async(transport, model, engine))


async def probe_async(transport: Transport, model: str | None = None, engine: str = "auto") -> ServerProfile:
    """`probe`, awaited (on any event loop; the requests run on the transport's)."""
    model, found, max_model_len = await served_model(transport, model, engine)
    base = {"model": model, "max_tokens": 1, "temperature": 1.0, "seed": 0, **found.ids_request}
    try:  # retried like any request: a transient failure must not pass for a missing feature
        answer = await transport.apost("completions", {**base, "prompt": "Hello", "n": 2, "logprobs": 1})
    except InvalidRequestError:  # e.g. a chat-only model: none of these features on /completions
        answer = {}
    choices = answer.get("choices") or []
    first = choices[0] if choices else {}
    logprobs = first.get("logprobs") or {}
    served_ids = first.get("token_ids")  # vLLM's return_token_ids form
    ids = served_ids if isinstance(served_ids, list) else [token_id(t) for t in logprobs.get("tokens") or []]
    returns_ids = bool(ids) and None not in ids
    scored = await _try(transport, {**base, "prompt": "Hello world", "echo": True, "logprobs": 1})
    scored_tokens = ((scored or {}).get("choices") or [{}])[0].get("logprobs") or {}
    as_ids = await _try(transport, {**base, "prompt": ids if returns_ids else [1, 2]})
    slots = await server_slots(transport)
    if slots is not None:  # never more in flight than the server works on: the rest wait here, untimed
        transport.limit_in_flight(min(slots, transport.max_in_flight))
    return ServerProfile(
        engine=found,
        model=model,
        max_model_len=max_model_len,
        native_n=len(choices) == 2,
        logprobs=bool(logprobs.get("token_logprobs")),
        top_logprobs=bool(logprobs.get("top_logprobs")),
        returns_token_ids=returns_ids,
        token_prompts=as_ids is not None and bool(as_ids.get("choices")),
        prompt_scoring=len(scored_tokens.get("tokens") or []) > 1,
        completions=bool(choices),
        slots=slots,
    )
