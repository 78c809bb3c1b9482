"""`SamplingParams.structured_outputs` as each serving engine's request fields, or a refusal.

    kind          vLLM                   SGLang                     llama.cpp (llama-cpp-python)      OpenAI
    json          structured_outputs     response_format            response_format {"type":         response_format
                  .json                  json_schema (chat);        "json_object", "schema"} (chat    json_schema, strict
                                         json_schema (completions)  only)                             (chat only)
    json_object   structured_outputs     response_format            response_format                   response_format
                  .json_object           json_object (chat);        {"type": "json_object"}           json_object
                                         json_schema (completions)  (chat only)                       (chat only)
    regex         structured_outputs     regex                      refused: GBNF has no regex        refused
                  .regex
    choice        structured_outputs     regex: the choices as an   grammar: the choices as a GBNF    refused
                  .choice                escaped alternation        alternation of string literals
    grammar       structured_outputs     ebnf (GBNF only; Lark      grammar (GBNF only; Lark          refused
                  .grammar               refused)                   refused)

Sources: vLLM `sampling_params.py` (StructuredOutputsParams: json, regex, choice, grammar,
json_object, disable_any_whitespace, whitespace_pattern) and `entrypoints/openai/protocol.py`
(`structured_outputs` on both endpoints); SGLang `srt/entrypoints/openai/protocol.py`
(CompletionRequest: json_schema, regex, ebnf, response_format; ChatCompletionRequest:
response_format, regex, ebnf); llama-cpp-python `server/types.py` (`grammar` on both
endpoints, `response_format` on /v1/chat/completions only: its /v1/completions would drop the
field without a word, so a JSON kind there is refused) and `llama_chat_format.py` (a
response_format schema is converted to GBNF by the server); OpenAI's API reference
(`response_format` on chat completions; no regex, choice or grammar).

The translations are exact: a choice list is the same language as an alternation of its
escaped literals. What an engine cannot take is refused with the reason, never degraded.

Whitespace: vLLM receives `max_whitespace` (as `whitespace_pattern`, or `disable_any_whitespace`
for 0); SGLang, llama.cpp and OpenAI apply their own whitespace rules inside JSON (the output
still validates against the schema; only the spacing may differ from a local run).
"""

from __future__ import annotations

import json

from metagen.structured.spec import StructuredOutputs

KINDS = {  # engine -> the kinds it takes
    "vllm": ("json", "json_object", "regex", "choice", "grammar"),
    "sglang": ("json", "json_object", "regex", "choice", "grammar"),
    "llama.cpp": ("json", "json_object", "choice", "grammar"),
    "openai": ("json", "json_object"),
    "metagen": ("json", "json_object", "regex", "choice", "grammar"),
}
LARK_GRAMMARS = frozenset({"vllm", "metagen"})  # engines whose grammar field takes Lark as well as GBNF
_REASONS = {
    ("llama.cpp", "regex"): "llama.cpp takes GBNF grammars, which have no regular expressions, and a regex "
                            "is not translated (not every regex has an exact GBNF form here); write it as "
                            "grammar= in GBNF",
    ("openai", "regex"): "OpenAI's API constrains outputs by a JSON schema (response_format) only",
    ("openai", "choice"): "OpenAI's API constrains outputs by a JSON schema (response_format) only; a schema "
                          "{\"enum\": [...]} inside an object does the same",
    ("openai", "grammar"): "OpenAI's API constrains outputs by a JSON schema (response_format) only",
}
_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")
_JSON_WHITESPACE = r"[ \t\n\r]"  # the four whitespace characters JSON allows between tokens


def supported_kinds(engine_name: str) -> tuple[str, ...]:
    """The constraint kinds `engine_name`'s server takes (empty: none)."""
    return KINDS.get(engine_name, ())


def constraint_fields(spec: StructuredOutputs | None, engine_name: str, endpoint: str) -> dict[str, object]:
    """The request fields that make `engine_name`'s server honour `spec` on `endpoint`
    ("completions" or "chat/completions"); {} for no constraint; ValueError naming the field and
    the reason when the engine cannot honour it."""
    if spec is None:
        return {}
    kind = spec.kind
    if kind not in supported_kinds(engine_name):
        reason = _REASONS.get((engine_name, kind), "it has no request field for it")
        raise ValueError(f"{spec.kind_field} is not supported by {engine_name}'s OpenAI-compatible server "
                         f"({reason}); use a local model or another backend")
    if kind == "grammar" and engine_name not in LARK_GRAMMARS and spec.grammar_syntax != "gbnf":
        raise ValueError(f"{spec.kind_field} is a Lark grammar, which {engine_name}'s server does not take: it "
                         "takes GBNF (rules written `name ::= ...`, start rule `root`)")
    return _BUILDERS[engine_name](spec, endpoint)


def _vllm(spec: StructuredOutputs, endpoint: str) -> dict[str, object]:
    value: object = {"json": spec.schema, "json_object": True, "regex": spec.regex,
                     "choice": list(spec.choice or ()), "grammar": spec.grammar}[spec.kind]
    fields: dict[str, object] = {spec.kind: value}
    if spec.kind in ("json", "json_object") and spec.max_whitespace is not None:
        if spec.max_whitespace == 0:
            fields["disable_any_whitespace"] = True
        else:
            fields["whitespace_pattern"] = f"{_JSON_WHITESPACE}{{0,{spec.max_whitespace}}}"
    return {"structured_outputs": fields}


def _sglang(spec: StructuredOutputs, endpoint: str) -> dict[str, object]:
    if spec.kind in ("json", "json_object"):
        if endpoint == "completions":
            return {"json_schema": json.dumps(spec.schema, ensure_ascii=False)}
        return {"response_format": _openai_json(spec)}
    if spec.kind == "regex":
        return {"regex": spec.regex}
    if spec.kind == "choice":
        return {"regex": "|".join(regex_literal(choice) for choice in spec.choice)}
    return {"ebnf": spec.grammar}


def _llama_cpp(spec: StructuredOutputs, endpoint: str) -> dict[str, object]:
    if spec.kind in ("json", "json_object"):
        _chat_only(spec, "llama.cpp", endpoint)
        if spec.kind == "json_object":
            return {"response_format": {"type": "json_object"}}
        return {"response_format": {"type": "json_object", "schema": spec.schema}}
    if spec.kind == "choice":
        return {"grammar": "root ::= " + " | ".join(gbnf_literal(choice) for choice in spec.choice) + "\n"}
    return {"grammar": spec.grammar}


def _openai(spec: StructuredOutputs, endpoint: str) -> dict[str, object]:
    _chat_only(spec, "openai", endpoint)
    return {"response_format": _openai_json(spec)}


def _openai_json(spec: StructuredOutputs) -> dict[str, object]:
    """OpenAI's response_format; strict, so the server guarantees the schema (or refuses it)."""
    if spec.kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": spec.schema, "strict": True}}


def _chat_only(spec: StructuredOutputs, engine_name: str, endpoint: str) -> None:
    if endpoint != "chat/completions":
        raise ValueError(f"{spec.kind_field} needs {engine_name}'s /v1/chat/completions (its /v1/completions has "
                         "no response_format and would ignore the schema): use chat messages or chat=True")


def regex_literal(text: str) -> str:
    """`text` as a regex matching exactly it: every metacharacter backslash-escaped."""
    return "".join("\\" + char if char in _REGEX_SPECIAL else char for char in text)


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal: quotes, backslashes and control characters escaped."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    body = "".join(escapes.get(char, char if ord(char) >= 0x20 else f"\\x{ord(char):02x}") for char in text)
    return f'"{body}"'


def _metagen(spec: StructuredOutputs, endpoint: str) -> dict[str, object]:
    """`metagen serve` takes the spec's own fields (both endpoints, every kind, Lark or GBNF)."""
    value: object = {"json": spec.schema, "json_object": True, "regex": spec.regex,
                     "choice": list(spec.choice or ()), "grammar": spec.grammar}[spec.kind]
    return {"structured_outputs": {spec.kind: value, "max_whitespace": spec.max_whitespace}}


_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "llama.cpp": _llama_cpp, "openai": _openai, "metagen": _metagen}
