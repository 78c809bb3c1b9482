"""The fields /v1/completions and /v1/chat/completions share, and the one parse of both
(`parse_fields`): a body -> a validated `ParsedRequest`. Each endpoint's module
(`completion_request`, `chat_request`) gives an `Endpoint`: its own fields and the reader of its
prompt; everything else is read here.

Every field is checked; a bad one raises `APIError` (HTTP 400, OpenAI's error body) whose
`param` names the field as the request spelled it. Unknown fields are refused, or ignored and
listed under --lenient (see `body`). A null value means "not given".

Shared fields: OpenAI's (model, max_tokens, temperature, top_p, n, stream,
stream_options.include_usage, stop, seed, frequency_penalty, presence_penalty, logit_bias,
response_format, user), every other `SamplingParams` field under its own name (top_k, min_p,
typical_p, epsilon_cutoff, eta_cutoff, repetition_penalty, no_repeat_ngram_size, mirostat_tau,
mirostat_eta, stop_token_ids, ignore_eos, structured_outputs, token_healing), vLLM's
`return_tokens_as_token_ids` (logprob tokens as "token_id:<id>"), `mirostat_mode` as llama.cpp
numbers it (0 = off, without mirostat_tau; 1 or 2 = that version, with it) and `metagen`, the
strategy (`strategy_request`).

In proxy mode (`model` None: the backends' servers generate, this server has no tokenizer) the
prompt is validated but not encoded (`prompt_ids` None; the backend encodes it and checks its
context), token ids are checked against no vocabulary, and what needs the local tokenizer is
refused by name: logprobs / top_logprobs (the token texts), echo and token_healing.

`max_n` (`metagen serve --max-n`, default `body.DEFAULT_MAX_N`, 128 as OpenAI's n) bounds a plain
request's n and a strategy's metagen.n and every option that counts work, here, before anything
is built for the request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from metagen.decoding.request import heal_request
from metagen.sampling import SamplingParams
from metagen.sampling.params import MAX_LOGPROBS
from metagen.serve.body import DEFAULT_MAX_N, APIError, param_of
from metagen.serve.requests import ParsedRequest
from metagen.serve.strategy_request import parse_strategy

# Every SamplingParams field is a request field under its own name, in its declared order, but the two each
# endpoint reads itself (`PromptFields`): max_tokens (chat: or max_completion_tokens), logprobs (chat: top_logprobs).
ENDPOINT_SAMPLING_FIELDS = ("max_tokens", "logprobs")
SAMPLING_FIELDS = tuple(item.name for item in fields(SamplingParams) if item.name not in ENDPOINT_SAMPLING_FIELDS)
COMMON_FIELDS = ("model", "stream", "stream_options", "user", "max_tokens", "return_tokens_as_token_ids",
                 "metagen")
SHARED_FIELDS = frozenset(SAMPLING_FIELDS + COMMON_FIELDS)  # every field both endpoints take
_MESSAGE_FIELDS = {field: field for field in (*SAMPLING_FIELDS, "max_tokens", "mirostat_tau", "logprobs")}
PROXY_REFUSALS = (("logprobs", "the backend's token texts are not relayed"),
                  ("top_logprobs", "the backend's token texts are not relayed"),
                  ("echo", "the prompt's log-probabilities are not relayed"),
                  ("token_healing", "healing backs up the prompt with the served tokenizer, which this server has not"))


@dataclass(frozen=True)
class PromptFields:
    """What an endpoint's own fields give the shared checks: the prompt's ids (None in proxy
    mode), the prompt as a strategy sees it (messages, text or token ids), its field name, the
    max_tokens field used and its default, the number of top alternatives per token
    (SamplingParams' `logprobs`, as given: checked there; None: no logprobs asked) and the field
    that gave it, and (completions) the prompt's text and echo."""

    ids: list[int] | None
    seen: object
    field: str
    limit_field: str
    default_max_tokens: int
    alternatives: object = None
    alternatives_field: str = "logprobs"
    text: str | None = None
    echo: bool = False


@dataclass(frozen=True)
class Endpoint:
    """One endpoint as the shared parse sees it: chat or not (the chat template, the healing of a
    chat prompt), every field it takes, and the reader of its own fields: (body with nulls
    dropped, model or None, stream) -> `PromptFields`, APIError on the first problem."""

    chat: bool
    fields: frozenset[str]
    read_prompt: Callable[[Mapping, object, bool], PromptFields]


def parse_fields(body: object, endpoint: Endpoint, *, model, served_name: str, max_rows: int,
                 lenient: bool = False, max_n: int = DEFAULT_MAX_N, retriever: str | None = None) -> ParsedRequest:
    """Validate `body` (decoded JSON) for `endpoint` against `model` (None: proxy mode, see the
    module docstring); APIError on the first problem. In this order: the body's own fields and
    the model, stream options and the sampling fields; then the endpoint's own
    (`endpoint.read_prompt`); then the model's context, SamplingParams and the limits, the
    strategy and token healing."""
    if not isinstance(body, Mapping):
        raise APIError("the request body must be a JSON object", None)
    body = {key: value for key, value in body.items() if value is not None}  # null = not given
    unknown = _unknown_fields(body, endpoint.fields, lenient)
    name, named_strategy = _model_name(body, served_name)
    stream, include_usage = _stream_options(body)
    token_strings = bool_field(body, "return_tokens_as_token_ids", False)
    values = _sampling_values(body)
    prompt = endpoint.read_prompt(body, model, stream)
    names = {field: field for field in (*SAMPLING_FIELDS, "logprobs")}  # SamplingParams field -> request field
    logprobs = prompt.alternatives is not None
    if logprobs:
        values["logprobs"], names["logprobs"] = prompt.alternatives, prompt.alternatives_field
    _check_against_model(body, model, prompt, logprobs)
    params = _sampling_params(body, prompt, values, names, model, max_rows, max_n)
    echo_text = None
    if prompt.echo:
        echo_text = prompt.text if prompt.text is not None else model.tokenizer.decode(prompt.ids)
    strategy = None
    if named_strategy is not None or "metagen" in body:
        strategy = parse_strategy(body, named_strategy, params, max_n, retriever)
    prompt_ids, healed = prompt.ids, ""
    if params.token_healing:
        if strategy is not None:
            raise APIError("token_healing=true is not supported with a strategy: its requests are built by the "
                           "strategy", "token_healing")
        if echo_text is not None:
            raise APIError("token_healing=true is not supported with echo=true (the echoed prompt would be the "
                           "healed one)", "token_healing")
        try:
            prompt_ids, healed = heal_request(params, model, prompt.seen, endpoint.chat, prompt_ids)
        except ValueError as error:
            raise APIError(str(error), "token_healing") from None
    return ParsedRequest(endpoint.chat, prompt_ids, params, name if strategy is not None else served_name, echo_text,
                         stream, include_usage, logprobs, token_strings, tuple(unknown), strategy, prompt.seen, healed)


def field_named(message: str) -> str | None:
    """The sampling field an error raised after parsing is about (a remote server's refusal, a
    strategy's), subfields included ("structured_outputs.regex is not supported by llama.cpp's
    server" -> "structured_outputs.regex"), when its message starts with one; else None."""
    return param_of(message, _MESSAGE_FIELDS)


def bool_field(body: Mapping, field: str, default: bool, name: str | None = None) -> bool:
    """`body[field]` (default `default`), which must be true or false; errors name it `name` or `field`."""
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise APIError(f"{name or field}={value!r} must be true or false", name or field)
    return value


def _unknown_fields(body: Mapping, allowed: frozenset[str], lenient: bool) -> list[str]:
    """The fields of `body` outside `allowed`, sorted: refused naming the first, unless `lenient`
    (then ignored and returned)."""
    unknown = sorted(set(body) - allowed)
    if unknown and not lenient:
        raise APIError(f"unknown field {unknown[0]!r}" + (f" (and {unknown[1:]})" if len(unknown) > 1 else "")
                       + ": this server refuses fields it would not honour (start it with --lenient to ignore them)",
                       unknown[0])
    return unknown


def _model_name(body: Mapping, served_name: str) -> tuple[object, str | None]:
    """The model named (default: the served one) and the strategy a name `strategy:model` asks for
    (else None); 404 for a model not served here."""
    name = body.get("model", served_name)
    if name != served_name and isinstance(name, str) and name.endswith(":" + served_name):
        return name, name[: -len(served_name) - 1]  # the form strategy:model
    if name != served_name:
        raise APIError(f"model {name!r} is not served here: this server serves {served_name!r}", "model",
                       status=404, code="model_not_found")
    return name, None


def _stream_options(body: Mapping) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage)."""
    stream = bool_field(body, "stream", False)
    include_usage = False
    if "stream_options" in body:
        options = body["stream_options"]
        if not stream:
            raise APIError("stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
            raise APIError("stream_options must be an object with the one field include_usage", "stream_options")
        include_usage = bool_field(options, "include_usage", False, "stream_options.include_usage")
    return stream, include_usage


def _sampling_values(body: Mapping) -> dict[str, object]:
    """The SamplingParams fields given under their own names (logit_bias's keys made ids), with
    llama.cpp's mirostat_mode checked against mirostat_tau."""
    values = {field: body[field] for field in SAMPLING_FIELDS if field in body}
    if "mirostat_mode" in body:  # llama.cpp's switch: 0 = off, 1 / 2 = that version with mirostat_tau
        mode = body["mirostat_mode"]
        if mode not in (0, 1, 2) or isinstance(mode, bool):
            raise APIError(f"mirostat_mode={mode!r} must be 0 (off), 1 or 2 (the Mirostat version)", "mirostat_mode")
        if (mode != 0) != (body.get("mirostat_tau") is not None):
            raise APIError(f"mirostat_mode={mode} " + ("needs mirostat_tau" if mode else
                                                       "turns mirostat off: drop mirostat_tau"), "mirostat_mode")
        if mode == 0:
            del values["mirostat_mode"]
    if "logit_bias" in values:
        values["logit_bias"] = _logit_bias(values["logit_bias"])
    return values


def _logit_bias(value: object) -> dict[int, object]:
    """OpenAI's {"token id as a string": bias} -> {int: bias}."""
    if not isinstance(value, Mapping):
        raise APIError(f"logit_bias must be an object mapping token ids to biases, got {value!r}", "logit_bias")
    converted = {}
    for key, bias in value.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise APIError(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if token_id < 0:
            raise APIError(f"logit_bias key {key!r} is not a token id (ids are >= 0)", "logit_bias")
        converted[token_id] = bias
    return converted


def _check_against_model(body: Mapping, model, prompt: PromptFields, logprobs: bool) -> None:
    """The prompt leaves room in the model's context for one token; in proxy mode (`model` None)
    what needs this server's tokenizer is refused instead, by name: `logprobs` asked (on
    completions any value, 0 included: the chosen token's text), top_logprobs, echo, token_healing."""
    if model is None:
        for field, why in PROXY_REFUSALS:
            value = body.get(field)
            if value not in (None, False, 0) or (field == "logprobs" and logprobs):
                raise APIError(f"{field}={value!r} is not supported in proxy mode (--backend): {why}", field)
    elif len(prompt.ids) >= model.max_context:
        raise APIError(f"the prompt has {len(prompt.ids)} tokens; this model's context is {model.max_context} "
                       "tokens, which must hold the prompt and at least one generated token", prompt.field,
                       code="context_length_exceeded")


def _sampling_params(body: Mapping, prompt: PromptFields, values: dict, names: dict, model, max_rows: int,
                     max_n: int) -> SamplingParams:
    """SamplingParams of the request, max_tokens from the endpoint's field (each error naming
    the field as the request spelled it: `names`), then the bounds on n and the token ids
    (below the vocabulary size; unbounded in proxy mode)."""
    names["max_tokens"] = prompt.limit_field
    values["max_tokens"] = body.get(prompt.limit_field, prompt.default_max_tokens)
    if "logprobs" in values and not (isinstance(values["logprobs"], int) and not isinstance(values["logprobs"], bool)):
        field = names["logprobs"]
        raise APIError(f"{field}={values['logprobs']!r} must be an int in [0, {MAX_LOGPROBS}]", field)
    try:
        params = SamplingParams(**values)
    except ValueError as error:
        raise APIError(str(error), param_of(str(error), names)) from None
    if params.n > max_n:
        raise APIError(f"n={params.n} is out of range: must be <= {max_n} (--max-n {max_n})", "n")
    if params.n > max_rows:
        raise APIError(f"n={params.n} is more than this server decodes at once (--max-rows {max_rows})", "n")
    vocab_size = model.vocab_size if model is not None else float("inf")
    for token_id in params.stop_token_ids:
        if token_id >= vocab_size:
            raise APIError(f"stop_token_ids entry {token_id} is out of range: must be in [0, {model.vocab_size})",
                           "stop_token_ids")
    for token_id, _ in params.logit_bias or ():
        if token_id >= vocab_size:
            raise APIError(f"logit_bias token id {token_id} is out of range: must be in [0, {model.vocab_size})",
                           "logit_bias")
    return params
