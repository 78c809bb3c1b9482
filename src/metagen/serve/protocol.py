"""Request bodies of /v1/completions and /v1/chat/completions -> a validated `ParsedRequest`.

Every field is checked; a bad one raises `APIError` (HTTP 400, OpenAI's error body) whose
`param` names the field as the request spelled it. Unknown fields are refused too (vLLM and
SGLang drop them silently; a client that misspells `top_k` should hear about it), unless the
server runs with --lenient, which ignores them and lists them in the response's header
`X-Metagen-Ignored-Fields` (`ignored_fields_header`: each name percent-encoded outside HTTP's
token characters, at most `IGNORED_HEADER_CHARS` characters, the names that do not fit counted).

Bodies (`load_body`): a POST's body must be declared JSON (`Content-Type: application/json`, or
`application/<x>+json`, parameters such as charset allowed; else 415), so that a web page, which
can send text/plain, form or multipart bodies to any address without asking, cannot drive a
server that has no API key; it may nest arrays and objects at most `MAX_JSON_DEPTH` deep (400,
checked before the recursive decoder runs).

Accepted fields: OpenAI's (model, prompt / messages, max_tokens / max_completion_tokens,
temperature, top_p, n, stream, stream_options.include_usage, stop, logprobs / top_logprobs,
seed, frequency_penalty, presence_penalty, logit_bias, response_format, user; `echo` (the
prompt and its log-probabilities before each completion; not with stream), `suffix` null and
`best_of` equal to n only, the other values refused by name), every other
`SamplingParams` field under its own name (top_k, min_p, typical_p, epsilon_cutoff, eta_cutoff,
repetition_penalty, no_repeat_ngram_size, mirostat_tau, mirostat_eta, stop_token_ids,
ignore_eos, structured_outputs), vLLM's `return_tokens_as_token_ids` (logprob tokens as
"token_id:<id>") and llama.cpp's `mirostat_mode` (0, or 2 together with mirostat_tau). A null value means "not given". Defaults: max_tokens 16 on completions (OpenAI's),
the rest of the context on chat.

In proxy mode (`model` None: the backends' servers generate, this server has no tokenizer) the
prompt is validated but not encoded (`prompt_ids` None; the backend encodes it and checks its
context), chat's default max_tokens is SamplingParams' (256), token ids are checked against no
vocabulary, and what needs the local tokenizer is refused by name: logprobs / top_logprobs (the
token texts), echo and token_healing.

`metagen` ({"strategy": NAME, option: value, ...}) or the model name `NAME:<served model>` asks
for a meta-generation strategy (`parse_strategy`): its options are the fields of the strategy's
own config dataclass (`StrategySpec.parse`), refused as `metagen.<field>`.

`max_n` (`metagen serve --max-n`, default 128 as OpenAI's n) bounds a plain request's n and a
strategy's metagen.n and every option that counts work (widths, expansions, iterations, depths:
`options.check_work`), here, before anything is built for the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from metagen.decoding.prompts import encode_prompt
from metagen.decoding.request import heal_request
from metagen.json_depth import MAX_JSON_DEPTH, check_json_depth
from metagen.sampling import SamplingParams
from metagen.sampling.params import MAX_LOGPROBS

if TYPE_CHECKING:
    from metagen.strategies.spec import StrategyOptions, StrategySpec

SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
    "frequency_penalty", "presence_penalty", "no_repeat_ngram_size", "logit_bias", "mirostat_tau", "mirostat_eta",
    "seed", "stop", "stop_token_ids", "ignore_eos", "n", "structured_outputs", "response_format", "token_healing",
)
COMMON_FIELDS = ("model", "stream", "stream_options", "user", "max_tokens", "return_tokens_as_token_ids",
                 "mirostat_mode", "metagen")
COMPLETION_FIELDS = frozenset(SAMPLING_FIELDS + COMMON_FIELDS + ("prompt", "logprobs", "echo", "suffix", "best_of"))
CHAT_FIELDS = frozenset(SAMPLING_FIELDS + COMMON_FIELDS + ("messages", "logprobs", "top_logprobs",
                                                            "max_completion_tokens"))
MESSAGE_FIELDS = frozenset(("role", "content"))
ROLES = ("system", "user", "assistant")
DEFAULT_MAX_N = 128  # the most completions, samples, branches or steps one request may ask for (OpenAI's bound on n)
_NAME_CHARACTER = re.compile(r"[A-Za-z0-9_]")
_SUBFIELDS = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*")  # ".json_schema.schema" after a field
IGNORED_HEADER_CHARS = 1024  # X-Metagen-Ignored-Fields at most this long (its tail "(N more)" included)
_MESSAGE_FIELDS = {field: field for field in (*SAMPLING_FIELDS, "max_tokens", "mirostat_tau", "logprobs")}
_TOKEN_CHARACTERS = "!#$&'*+-.^_`|~"  # RFC 9110 tchar besides letters and digits ('%' left out: it escapes)


class APIError(Exception):
    """An error answered with OpenAI's body {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    """One request as the API gave it, parsed and checked (never changed after): what the backends
    and the response builders need.

    chat: from /v1/chat/completions. logprobs: report per-token log-probabilities (the number of
    top alternatives is `params.logprobs`). include_usage: a final usage chunk when streaming.
    ignored: unknown fields dropped under --lenient.
    """

    chat: bool
    prompt_ids: list[int] | None  # None in proxy mode (the backend encodes the prompt)
    params: SamplingParams
    model: str
    echo_text: str | None = None  # echo: the prompt's text, put before each completion
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    token_ids_as_strings: bool = False
    ignored: tuple[str, ...] = ()
    strategy: StrategyRequest | None = None  # a meta-generation strategy runs (strategy.py)
    prompt: object = None  # the prompt as the strategy sees it: messages (chat), text or token ids
    healed: str = ""  # token_healing: the prompt text backed up, which the output must reproduce


@dataclass(frozen=True)
class StrategyRequest:
    """A strategy asked for by `metagen.strategy` or the model name `strategy:model`: its registry
    entry, its budget n, its StrategyOptions and its config overrides (validated by `spec.parse`)."""

    spec: StrategySpec
    n: int
    options: StrategyOptions
    overrides: dict


def check_json_content_type(content_type: str | None) -> None:
    """415 unless `content_type` (a request's Content-Type header) declares JSON: application/json
    or application/<x>+json, with or without parameters (charset=utf-8)."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    given = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    raise APIError(f"the request body has {given}: send it as JSON with Content-Type: application/json", None,
                   status=415, code="unsupported_media_type")


def load_body(body: bytes) -> object:
    """The JSON value of a request body; 400 when it is not JSON or nests arrays and objects deeper
    than MAX_JSON_DEPTH (measured without recursion before the recursive decoder runs, see
    metagen.json_depth). The text is decoded as `json.loads` decodes bytes (UTF-8, -16 or -32)."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError as error:
        raise APIError(f"the request body is not valid JSON: {error}", None) from None
    try:
        check_json_depth(text, "the request body")
    except ValueError as error:
        raise APIError(str(error), None, code="json_too_deep") from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise APIError(f"the request body is not valid JSON: {error}", None) from None


def ignored_fields_header(names: Sequence[str], limit: int = IGNORED_HEADER_CHARS) -> str:
    """X-Metagen-Ignored-Fields for the unknown fields `names` that --lenient ignored: the names
    comma-separated, each percent-encoded (UTF-8) outside RFC 9110's token characters, so the value
    is ASCII with no CR, LF, NUL or comma inside a name (urllib.parse.unquote reads a name back);
    names past `limit` characters are counted in a last item "(N more)", which no encoded name can
    spell. O(total length of the names)."""
    encoded = [quote(name, safe=_TOKEN_CHARACTERS, errors="surrogatepass") for name in names]
    whole = ",".join(encoded)
    if len(whole) <= limit:
        return whole
    room = limit - len(f"({len(names)} more)")  # kept for the count
    parts: list[str] = []
    used = 0
    for item in encoded:
        used += len(item) + 1  # the item and the comma after it
        if used > room:
            break
        parts.append(item)
    return ",".join([*parts, f"({len(names) - len(parts)} more)"])


@dataclass(frozen=True)
class _Prompt:
    """What an endpoint's own fields give the shared checks: the prompt's ids (None in proxy
    mode), the prompt as a strategy sees it (messages, text or token ids), its field name, the
    max_tokens field used and its default, logprobs asked, and (completions) the prompt's text
    and echo."""

    ids: list[int] | None
    seen: object
    field: str
    limit_field: str
    default_max_tokens: int
    logprobs: bool
    text: str | None = None
    echo: bool = False


def parse_request(body: object, *, chat: bool, model, served_name: str, max_rows: int,
                  lenient: bool = False, max_n: int = DEFAULT_MAX_N) -> ParsedRequest:
    """Validate `body` (decoded JSON) for one endpoint against `model` (None: proxy mode, see the
    module docstring); APIError on the first problem. The fields both endpoints share are read
    here, in this order: the body's own fields and the model, stream options and the sampling
    fields; then the endpoint's own (`_chat_prompt_fields` / `_completion_prompt_fields`); then
    the model's context, SamplingParams and the limits, the strategy and token healing."""
    if not isinstance(body, Mapping):
        raise APIError("the request body must be a JSON object", None)
    body = {key: value for key, value in body.items() if value is not None}  # null = not given
    unknown = _unknown_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, lenient)
    name, named_strategy = _model_name(body, served_name)
    stream, include_usage = _stream_options(body)
    token_strings = _bool(body, "return_tokens_as_token_ids", False)
    names = {field: field for field in (*SAMPLING_FIELDS, "logprobs")}  # SamplingParams field -> request field
    values = _sampling_values(body)
    if chat:
        prompt = _chat_prompt_fields(body, model, values, names)
    else:
        prompt = _completion_prompt_fields(body, model, stream, values)
    _check_against_model(body, model, prompt, chat)
    params = _sampling_params(body, prompt, values, names, model, max_rows, max_n)
    echo_text = None
    if prompt.echo:
        echo_text = prompt.text if prompt.text is not None else model.tokenizer.decode(prompt.ids)
    strategy = None
    if named_strategy is not None or "metagen" in body:
        strategy = parse_strategy(body, named_strategy, params, max_n)
    prompt_ids, healed = prompt.ids, ""
    if params.token_healing:
        if strategy is not None:
            raise APIError("token_healing=true is not supported with a strategy: its requests are built by the "
                           "strategy", "token_healing")
        if echo_text is not None:
            raise APIError("token_healing=true is not supported with echo=true (the echoed prompt would be the "
                           "healed one)", "token_healing")
        try:
            prompt_ids, healed = heal_request(params, model, prompt.seen, chat, prompt_ids)
        except ValueError as error:
            raise APIError(str(error), "token_healing") from None
    return ParsedRequest(chat, prompt_ids, params, name if strategy is not None else served_name, echo_text, stream,
                         include_usage, prompt.logprobs, token_strings, tuple(unknown), strategy, prompt.seen, healed)


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
    stream = _bool(body, "stream", False)
    include_usage = False
    if "stream_options" in body:
        options = body["stream_options"]
        if not stream:
            raise APIError("stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
            raise APIError("stream_options must be an object with the one field include_usage", "stream_options")
        include_usage = _bool(options, "include_usage", False, "stream_options.include_usage")
    return stream, include_usage


def _sampling_values(body: Mapping) -> dict[str, object]:
    """The SamplingParams fields given under their own names (logit_bias's keys made ids), with
    llama.cpp's mirostat_mode checked against mirostat_tau."""
    values = {field: body[field] for field in SAMPLING_FIELDS if field in body}
    if "mirostat_mode" in body:  # llama.cpp's switch: 2 = Mirostat 2.0 with mirostat_tau, 0 = off
        mode = body["mirostat_mode"]
        if mode not in (0, 2) or isinstance(mode, bool):
            raise APIError(f"mirostat_mode={mode!r} must be 0 (off) or 2 (Mirostat 2.0; version 1 is not "
                           "implemented)", "mirostat_mode")
        if (mode == 2) != ("mirostat_tau" in body):
            raise APIError(f"mirostat_mode={mode} " + ("needs mirostat_tau" if mode == 2 else
                                                       "turns mirostat off: drop mirostat_tau"), "mirostat_mode")
    if "logit_bias" in values:
        values["logit_bias"] = _logit_bias(values["logit_bias"])
    return values


def _chat_prompt_fields(body: Mapping, model, values: dict, names: dict) -> _Prompt:
    """/v1/chat/completions' own fields: messages, logprobs + top_logprobs (the number of top
    alternatives, into `values` / `names`), max_completion_tokens or max_tokens (default: the
    rest of the context; SamplingParams' in proxy mode)."""
    prompt_ids = _chat_prompt(body, model)
    logprobs = _bool(body, "logprobs", False)
    if "top_logprobs" in body:
        if not logprobs:
            raise APIError("top_logprobs needs logprobs=true", "top_logprobs")
        values["logprobs"], names["logprobs"] = body["top_logprobs"], "top_logprobs"
    elif logprobs:
        values["logprobs"] = 0
    limit_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if "max_completion_tokens" in body and "max_tokens" in body:
        raise APIError("give max_tokens or max_completion_tokens, not both", "max_tokens")
    default_max = max(model.max_context - len(prompt_ids), 1) if model is not None else SamplingParams.max_tokens
    return _Prompt(prompt_ids, _plain_messages(body), "messages", limit_field, default_max, logprobs)


def _completion_prompt_fields(body: Mapping, model, stream: bool, values: dict) -> _Prompt:
    """/v1/completions' own fields: prompt, suffix (null only), echo (not with stream), best_of
    (equal to n only), logprobs (the number of top alternatives, into `values`), max_tokens
    (default 16, OpenAI's)."""
    prompt_ids, prompt_text = _completion_prompt(body, model)
    if "suffix" in body:
        raise APIError(f"suffix={body['suffix']!r} is not supported by this server (no fill-in-the-middle)",
                       "suffix")
    echo = _bool(body, "echo", False)
    if echo and stream:
        raise APIError("echo=true is not supported with stream=true (the echoed prompt comes with the whole "
                       "answer)", "echo")
    if "best_of" in body and body["best_of"] != body.get("n", 1):
        raise APIError(f"best_of={body['best_of']!r} is not supported: only best_of equal to n", "best_of")
    logprobs = "logprobs" in body
    if logprobs:
        values["logprobs"] = body["logprobs"]
    seen = prompt_text if prompt_text is not None else prompt_ids
    return _Prompt(prompt_ids, seen, "prompt", "max_tokens", 16, logprobs, prompt_text, echo)


def _check_against_model(body: Mapping, model, prompt: _Prompt, chat: bool) -> None:
    """The prompt leaves room in the model's context for one token; in proxy mode (`model` None)
    what needs this server's tokenizer is refused instead."""
    if model is None:
        _refuse_without_tokenizer(body, chat)
    elif len(prompt.ids) >= model.max_context:
        raise APIError(f"the prompt has {len(prompt.ids)} tokens; this model's context is {model.max_context} "
                       "tokens, which must hold the prompt and at least one generated token", prompt.field,
                       code="context_length_exceeded")


def _sampling_params(body: Mapping, prompt: _Prompt, values: dict, names: dict, model, max_rows: int,
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
        raise APIError(str(error), _param_of(str(error), names)) from None
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


def only(body: Mapping, allowed: set[str]) -> None:
    """400 naming the first field of `body` outside `allowed`."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise APIError(f"unknown field {unknown[0]!r}: allowed are {sorted(allowed)}", unknown[0])


def check_model(body: Mapping, served_name: str) -> None:
    """404 when `body` names a model other than `served_name`."""
    if body.get("model", served_name) != served_name:
        raise APIError(f"model {body['model']!r} is not served here: this server serves {served_name!r}", "model",
                       status=404, code="model_not_found")


PROXY_REFUSALS = (("logprobs", "the backend's token texts are not relayed"),
                  ("top_logprobs", "the backend's token texts are not relayed"),
                  ("echo", "the prompt's log-probabilities are not relayed"),
                  ("token_healing", "healing backs up the prompt with the served tokenizer, which this server has not"))


def _refuse_without_tokenizer(body: Mapping, chat: bool) -> None:
    """Proxy mode: what needs this server's own tokenizer, refused by name."""
    for field, why in PROXY_REFUSALS:
        value = body.get(field)
        if value not in (None, False, 0) or (field == "logprobs" and not chat and field in body):
            raise APIError(f"{field}={value!r} is not supported in proxy mode (--backend): {why}", field)


SERVED_VALUES = ("steps", "judge")  # a value-head file would be a path named by the request: refused


def parse_strategy(body: Mapping, named: str | None, params: SamplingParams,
                   max_n: int = DEFAULT_MAX_N) -> StrategyRequest:
    """The strategy of a request: `metagen` {"strategy": NAME, option: value, ...} and/or the model
    name NAME:model (the two must agree); every option is checked by the strategy's own config
    (`StrategySpec.parse`; n and every option that counts work <= `max_n`), and request fields a
    strategy cannot honour are refused by name."""
    from metagen.strategies.registry import get_strategy

    given = body.get("metagen", {})
    if not isinstance(given, Mapping):
        raise APIError("metagen must be an object such as {\"strategy\": \"self_consistency\", \"n\": 8}", "metagen")
    given = dict(given)
    name = given.pop("strategy", None)
    if name is None and named is None:
        raise APIError("metagen.strategy is required (or name it in the model: strategy:model)", "metagen.strategy")
    if name is not None and named is not None and name != named:
        raise APIError(f"metagen.strategy={name!r} and the model name's strategy {named!r} disagree: give one",
                       "metagen.strategy")
    name = name if name is not None else named
    where = "metagen.strategy" if named is None or "strategy" in body.get("metagen", {}) else "model"
    if not isinstance(name, str):
        raise APIError(f"metagen.strategy={name!r} must be a strategy name", "metagen.strategy")
    try:
        spec = get_strategy(name)
    except ValueError as error:
        raise APIError(str(error), where) from None
    try:
        n, options, overrides = spec.parse(given, "metagen.", max_n=max_n, limit_name=f"--max-n {max_n}")
    except ValueError as error:
        message = str(error)  # "metagen.<option>..." for an option given or defaulted; anything else is about metagen
        options = {f"metagen.{option}": f"metagen.{option}" for option in [*given, *spec.fields()]
                   if isinstance(option, str)}
        raise APIError(message, _param_of(message, options) or "metagen") from None
    if options.value is not None and options.value not in SERVED_VALUES:
        raise APIError(f"metagen.value={options.value!r}: this server takes {' or '.join(SERVED_VALUES)} (a value-head "
                       "file would be a path named by the request, which the server does not open)", "metagen.value")
    if spec.uses_value and options.value is None:
        raise APIError(f"strategy {name!r} needs metagen.value: {' or '.join(SERVED_VALUES)}", "metagen.value")
    refusals = (("stream", body.get("stream"), "the chosen output is known only when the strategy has finished"),
                ("n", params.n != 1, "a strategy returns one chosen output; its budget is metagen.n"),
                ("logprobs", body.get("logprobs"), "the chosen output may be built from several requests"),
                ("top_logprobs", "top_logprobs" in body, "the chosen output may be built from several requests"),
                ("echo", body.get("echo"), "a strategy's prompts are its own"))
    for field, refused, why in refusals:
        if refused:
            raise APIError(f"{field} is not supported with a strategy ({name!r}): {why}", field)
    return StrategyRequest(spec, n, options, overrides)


def _param_of(message: str, fields: Mapping[str, str]) -> str | None:
    """The request field an error of SamplingParams (or of a strategy's options) is about: the
    field its message starts with, with the subfields that follow ("temperature=-1 is out of
    range", "response_format.json_schema.schema='...' does not compile"), when it is one of
    `fields` (the longest wins), spelled as the request spelled it (`fields` maps the message's
    name to the request's); None otherwise, so that a message starting with an ordinary word
    ("Expecting value", "maximum recursion depth") never becomes a param. O(|fields| log |fields|)."""
    for known in sorted(fields, key=len, reverse=True):
        after = message[len(known):]
        if message.startswith(known) and not _NAME_CHARACTER.match(after):  # "temperature=", not "temperatures"
            return fields[known] + _SUBFIELDS.match(after).group(0)
    return None


def field_named(message: str) -> str | None:
    """The sampling field an error raised after parsing is about (a remote server's refusal, a
    strategy's), subfields included ("structured_outputs.regex is not supported by llama.cpp's
    server" -> "structured_outputs.regex"), when its message starts with one; else None."""
    return _param_of(message, _MESSAGE_FIELDS)


def _bool(body: Mapping, field: str, default: bool, name: str | None = None) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise APIError(f"{name or field}={value!r} must be true or false", name or field)
    return value


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


def _completion_prompt(body: Mapping, model) -> tuple[list[int], str | None]:
    """Token ids of `prompt` and its text (None for token ids): text (encoded without a chat
    template) or token ids; a list of one of either is accepted, several prompts are refused."""
    if "prompt" not in body:
        raise APIError("prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(item, (str, list)) for item in prompt):
        if len(prompt) != 1:
            raise APIError(f"prompt holds {len(prompt)} prompts: this server takes one prompt per request", "prompt")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise APIError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if isinstance(prompt, list) and not all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
        raise APIError("prompt must be a string or a list of int token ids", "prompt")
    if model is None:  # proxy mode: the backend encodes and checks it
        if not prompt or (isinstance(prompt, list) and min(prompt) < 0):
            raise APIError("prompt must be a non-empty string or list of token ids >= 0", "prompt")
        return (list(prompt) if isinstance(prompt, list) else None), (prompt if isinstance(prompt, str) else None)
    try:
        ids = encode_prompt(model.tokenizer, prompt, chat=False, vocab_size=model.vocab_size)
    except ValueError as error:
        raise APIError(str(error), "prompt") from None
    return ids, prompt if isinstance(prompt, str) else None


def _plain_messages(body: Mapping) -> list[dict]:
    """`messages` as {role, content} with text content (checked by `_chat_prompt` first)."""
    return [{"role": m["role"], "content": _text_content(m.get("content"), f"messages[{i}].content")}
            for i, m in enumerate(body["messages"])]


def _chat_prompt(body: Mapping, model) -> list[int]:
    """Token ids of `messages` through the model's chat template (a final assistant message is
    continued, see `encode_prompt`). Content is a string or a list of text parts."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content} objects", "messages")
    if model is not None and model.tokenizer.chat_template is None:
        raise APIError(f"{model.name} has no chat template: use /v1/completions", "messages")
    plain = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise APIError(f"{where} must be an object with role and content", where)
        extra = sorted(set(message) - MESSAGE_FIELDS)
        if extra:
            raise APIError(f"{where} has unsupported field {extra[0]!r}: messages take role and content",
                           f"{where}.{extra[0]}")
        role = message.get("role")
        if role not in ROLES:
            raise APIError(f"{where}.role={role!r} must be one of {list(ROLES)}", f"{where}.role")
        plain.append({"role": role, "content": _text_content(message.get("content"), f"{where}.content")})
    if model is None:  # proxy mode: the backend applies its template
        return None
    try:
        return encode_prompt(model.tokenizer, plain, vocab_size=model.vocab_size)
    except ValueError as error:
        raise APIError(str(error), "messages") from None


def _text_content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"{where}[{index}] must be a text part {{\"type\": \"text\", \"text\": ...}}: "
                               "this server reads text only", f"{where}[{index}]")
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(f"{where} must be a string or a list of text parts", where)
