"""A body of /v1/chat/completions -> a validated `ParsedRequest` (`parse_chat`).

Its own fields, besides the shared ones (`request_fields`): `messages` ({role, content} objects,
role one of `ROLES`, content a string or a list of text parts; encoded with the model's chat
template, a final assistant message continued), `logprobs` (true or false) with `top_logprobs`
(the number of top alternatives), and the limit as `max_completion_tokens` or `max_tokens` (not
both). The limit defaults to the rest of the context; in proxy mode (no local tokenizer: the
backend applies its template) to SamplingParams' (256).
"""

from __future__ import annotations

from collections.abc import Mapping

from metagen.decoding.prompts import encode_prompt
from metagen.sampling import SamplingParams
from metagen.serve.body import DEFAULT_MAX_N, APIError
from metagen.serve.request_fields import SHARED_FIELDS, Endpoint, PromptFields, bool_field, parse_fields
from metagen.serve.requests import ParsedRequest

CHAT_FIELDS = SHARED_FIELDS | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"}
MESSAGE_FIELDS = frozenset(("role", "content"))
ROLES = ("system", "user", "assistant")


def parse_chat(body: object, *, model, served_name: str, max_rows: int, lenient: bool = False,
               max_n: int = DEFAULT_MAX_N, retriever: str | None = None) -> ParsedRequest:
    """Validate `body` (decoded JSON) of /v1/chat/completions against `model` (None: proxy mode);
    APIError on the first problem (`request_fields.parse_fields`)."""
    return parse_fields(body, CHAT, model=model, served_name=served_name, max_rows=max_rows, lenient=lenient,
                        max_n=max_n, retriever=retriever)


def _chat_fields(body: Mapping, model, stream: bool) -> PromptFields:
    """/v1/chat/completions' own fields: messages, logprobs + top_logprobs (the number of top
    alternatives), max_completion_tokens or max_tokens (default: the rest of the context;
    SamplingParams' in proxy mode). `stream` is not read here."""
    prompt_ids = _chat_prompt(body, model)
    logprobs = bool_field(body, "logprobs", False)
    alternatives, alternatives_field = None, "logprobs"
    if "top_logprobs" in body:
        if not logprobs:
            raise APIError("top_logprobs needs logprobs=true", "top_logprobs")
        alternatives, alternatives_field = body["top_logprobs"], "top_logprobs"
    elif logprobs:
        alternatives = 0
    limit_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if "max_completion_tokens" in body and "max_tokens" in body:
        raise APIError("give max_tokens or max_completion_tokens, not both", "max_tokens")
    default_max = max(model.max_context - len(prompt_ids), 1) if model is not None else SamplingParams.max_tokens
    return PromptFields(prompt_ids, _plain_messages(body), "messages", limit_field, default_max, alternatives,
                        alternatives_field)


CHAT = Endpoint(chat=True, fields=CHAT_FIELDS, read_prompt=_chat_fields)


def _chat_prompt(body: Mapping, model) -> list[int] | None:
    """Token ids of `messages` through the model's chat template (a final assistant message is
    continued, see `encode_prompt`; None in proxy mode). Content is a string or a list of text
    parts."""
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


def _plain_messages(body: Mapping) -> list[dict]:
    """`messages` as {role, content} with text content (checked by `_chat_prompt` first)."""
    return [{"role": m["role"], "content": _text_content(m.get("content"), f"messages[{i}].content")}
            for i, m in enumerate(body["messages"])]


def _text_content(content: object, where: str) -> str:
    """A message's content as text: a string, or the texts of a list of text parts joined."""
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
