"""What every request body of the server meets, whichever endpoint it is for: the error it is
answered with (`APIError`: HTTP 400 or another status, OpenAI's error body, whose `param` names the
field as the request spelled it; `param_of` finds that field in a check's message), its loading
(`check_json_content_type`, `load_body`), the header listing the fields --lenient ignored
(`ignored_fields_header`), the checks of the endpoints other than generation (`only`,
`check_model`) and the default bound on the work one request may ask for (`DEFAULT_MAX_N`).

Bodies (`load_body`): a POST's body must be declared JSON (`Content-Type: application/json`, or
`application/<x>+json`, parameters such as charset allowed; else 415), so that a web page, which
can send text/plain, form or multipart bodies to any address without asking, cannot drive a
server that has no API key; it may nest arrays and objects at most `MAX_JSON_DEPTH` deep (400,
checked before the recursive decoder runs).

Unknown fields are refused (vLLM and SGLang drop them silently; a client that misspells `top_k`
should hear about it), unless the server runs with --lenient, which ignores them and lists them in
the response's header `X-Metagen-Ignored-Fields` (`ignored_fields_header`: each name
percent-encoded outside HTTP's token characters, at most `IGNORED_HEADER_CHARS` characters, the
names that do not fit counted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from metagen.json_depth import check_json_depth

DEFAULT_MAX_N = 128  # the most completions, samples, branches or steps one request may ask for (OpenAI's bound on n)
IGNORED_HEADER_CHARS = 1024  # X-Metagen-Ignored-Fields at most this long (its tail "(N more)" included)
_NAME_CHARACTER = re.compile(r"[A-Za-z0-9_]")
_SUBFIELDS = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*")  # ".json_schema.schema" after a field
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


def param_of(message: str, fields: Mapping[str, str]) -> str | None:
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
