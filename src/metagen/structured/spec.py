"""`StructuredOutputs`: what shape the generated text must have, with the names users know.

Exactly one kind per request (vLLM's current field names):

    json         a JSON Schema (a dict, or its JSON text)
    json_object  True: any JSON object (the schema {"type": "object"})
    regex        a regular expression the whole output must match (Rust `regex` syntax, no
                 look-around); anchored at both ends
    choice       a list of strings; the output is exactly one of them
    grammar      a context-free grammar in Lark syntax (llguidance's dialect) or llama.cpp GBNF
                 (`root ::= ...`; converted to Lark by llguidance)

`max_whitespace` bounds the whitespace a JSON kind allows between tokens (default 8 characters:
a newline and indentation three levels deep at two spaces); None lifts the bound. Without a
bound a small model can emit newlines forever and never close the object.

OpenAI's `response_format` maps onto it with `from_response_format`:

    {"type": "text"}                                              -> None (no constraint)
    {"type": "json_object"}                                       -> json_object=True
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
                                                                  -> json={...}

A frozen, hashable value: the schema is stored as compact JSON text, choices as a tuple. The
schema's key order is kept, not sorted: llguidance generates properties in the order the schema
lists them (so a "reasoning" field listed before "answer" is written first). Whether the spec compiles is checked by `metagen.structured.compile.check_compiles`.
"""

from __future__ import annotations

import json as json_module
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metagen.json_depth import check_json_depth

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# llguidance's test for Lark: a line starting (after spaces / tabs) with `%llguidance` or `start:`.
# [^\S\n] (whitespace but newline) keeps the search linear: `^\s*` would rescan every following
# blank line from each line start, O(L^2) on a grammar of many newlines.
_LARK_START = re.compile(r"^[^\S\n]*(%llguidance\b|start\s*:)", re.MULTILINE)
DEFAULT_MAX_WHITESPACE = 8


@dataclass(frozen=True)
class StructuredOutputs:
    """One output constraint (see the module docstring); exactly one of the kind fields is set.

    Fields:
        json: JSON Schema as a dict or JSON text; stored as JSON text, key order kept.
        regex: a regular expression matched against the whole output.
        choice: the allowed outputs (non-empty strings, at least one); stored as a tuple.
        grammar: a Lark grammar (with a `start` rule) or a GBNF grammar (with a `root` rule).
        json_object: True for any JSON object.
        max_whitespace: most whitespace characters between JSON tokens (>= 0), or None for no bound.
        field: how the request spelled this spec, named in error messages ("structured_outputs",
            "response_format", or a command-line option such as "--regex").
    """

    json: str | Mapping[str, Any] | bool | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    max_whitespace: int | None = DEFAULT_MAX_WHITESPACE
    field: str = "structured_outputs"

    def __post_init__(self) -> None:
        if not isinstance(self.json_object, bool):
            raise ValueError(f"{self.field}.json_object={self.json_object!r} must be a bool")
        chosen = [name for name in KINDS if (getattr(self, name) not in (None, False))]
        if len(chosen) != 1:
            raise ValueError(f"{self.field} needs exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(chosen) if chosen else 'none'}")
        if self.max_whitespace is not None and (
            isinstance(self.max_whitespace, bool) or not isinstance(self.max_whitespace, int) or self.max_whitespace < 0
        ):
            raise ValueError(f"{self.field}.max_whitespace={self.max_whitespace!r} must be an int >= 0 or None")
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.kind_field, self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{self.field}.{name} must be a str, got {type(value).__name__}")
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(f"{self.field}.choice", self.choice))

    @property
    def kind(self) -> str:
        """The kind that is set: "json", "json_object", "regex", "choice" or "grammar"."""
        return next(name for name in KINDS if getattr(self, name) not in (None, False))

    @property
    def kind_field(self) -> str:
        """The field holding the constraint, as the request spelled it (for error messages)."""
        if self.field.startswith("--"):  # a command-line option names the whole constraint
            return self.field
        if self.field == "response_format":
            return "response_format.json_schema.schema" if self.kind == "json" else "response_format"
        return f"{self.field}.{self.kind}"

    @property
    def grammar_syntax(self) -> str | None:
        """"lark" when a line of `grammar` starts with `start:` (or `%llguidance`), else "gbnf"
        (llama.cpp's syntax, start rule `root`), as llguidance decides; None for other kinds."""
        if self.grammar is None:
            return None
        return "lark" if _LARK_START.search(self.grammar) else "gbnf"

    @property
    def schema(self) -> Any:
        """The JSON Schema as a Python value (json_object: {"type": "object"}); None for other kinds."""
        if self.kind == "json_object":
            return {"type": "object"}
        return None if self.json is None else json_module.loads(self.json)

    def cache_key(self) -> tuple:
        """(kind, constraint text, max_whitespace): equal keys compile to the same grammar."""
        text = {"json": self.json, "json_object": "", "regex": self.regex, "grammar": self.grammar,
                "choice": self.choice}[self.kind]
        whitespace = self.max_whitespace if self.kind in ("json", "json_object") else None
        return (self.kind, text, whitespace)


def from_response_format(response_format: Mapping[str, Any] | None,
                         max_whitespace: int | None = DEFAULT_MAX_WHITESPACE) -> StructuredOutputs | None:
    """OpenAI's `response_format` as a `StructuredOutputs` (None for {"type": "text"} or None).

    Raises ValueError naming the part of `response_format` that is wrong.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ValueError(f"response_format={response_format!r} must be a mapping with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True, max_whitespace=max_whitespace, field="response_format")
    if kind != "json_schema":
        raise ValueError(f"response_format.type={kind!r} must be 'text', 'json_object' or 'json_schema'")
    body = response_format.get("json_schema")
    if not isinstance(body, Mapping) or "schema" not in body:
        raise ValueError("response_format.json_schema must be a mapping with a 'schema' (and 'name', 'strict'), "
                         f"got {body!r}")
    unknown = set(body) - {"name", "schema", "strict", "description"}
    if unknown:
        raise ValueError(f"response_format.json_schema has unknown keys {sorted(unknown)}: "
                         "allowed are name, schema, strict, description")
    if "strict" in body and not isinstance(body["strict"], bool) and body["strict"] is not None:
        raise ValueError(f"response_format.json_schema.strict={body['strict']!r} must be a bool")
    return StructuredOutputs(json=body["schema"], max_whitespace=max_whitespace, field="response_format")


def _schema_text(field: str, schema: object) -> str:
    """Canonical JSON text of a schema given as a dict, a bool or JSON text (at most MAX_JSON_DEPTH
    deep: the decoder, the encoder and the schema compiler recurse per level)."""
    if isinstance(schema, str):
        check_json_depth(schema, field)
        try:
            schema = json_module.loads(schema)
        except json_module.JSONDecodeError as error:
            raise ValueError(f"{field} is not valid JSON: {error}") from None
    if not isinstance(schema, (Mapping, bool)):
        raise ValueError(f"{field} must be a JSON Schema (an object or a bool), got {type(schema).__name__}")
    try:
        return json_module.dumps(schema, ensure_ascii=False)  # key order kept: it is the order of generation
    except (TypeError, ValueError, RecursionError) as error:  # RecursionError: a dict nested too deep
        raise ValueError(f"{field} cannot be written as JSON: {error}") from None


def _choices(field: str, choice: object) -> tuple[str, ...]:
    if isinstance(choice, (str, bytes)) or not isinstance(choice, Sequence):
        raise ValueError(f"{field}={choice!r} must be a list of strings")
    items = tuple(choice)
    if not items:
        raise ValueError(f"{field} is empty: give at least one choice")
    for item in items:
        if not isinstance(item, str) or not item:
            raise ValueError(f"{field} must hold non-empty strings, got {item!r}")
    return items
