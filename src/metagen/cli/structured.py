"""The output-constraint options of `metagen generate` and `metagen eval`, and the spec they make.

    --json-schema FILE|JSON   a JSON Schema: a path to a file, or the schema itself as JSON text.
                              A value starting with `{` (after spaces) is read as JSON text, any
                              other value as a path; errors say which of the two was meant.
    --json-object             any JSON object (the schema {"type": "object"})
    --regex REGEX             the whole output matches REGEX (Rust `regex` syntax, no look-around)
    --choice TEXT             the output is exactly one of the choices; repeat the flag for
                              several (`--choice yes --choice no`), or separate them by commas in
                              one value (`--choice yes,no`); `\\,` is a literal comma and `\\\\` a
                              backslash
    --grammar FILE            a context-free grammar; the kind is chosen by the text, not the file
                              name: a line starting with `start:` makes it Lark (llguidance's
                              dialect), otherwise it is read as llama.cpp GBNF (start rule `root`)
    --max-whitespace N        JSON kinds: most whitespace characters between JSON tokens
                              (default 8; -1 lifts the bound)
    --token-healing           back up a prompt that ends mid-token and make the first generated
                              tokens reproduce the removed text

At most one constraint option per command; a constraint that does not compile is a ValueError
naming the option and llguidance's message (raised before the model is loaded).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CONSTRAINT_OPTIONS = ("json-schema", "json-object", "regex", "choice", "grammar")
STRUCTURED_OPTIONS = CONSTRAINT_OPTIONS + ("max-whitespace", "token-healing")  # as typed, without dashes
_DIAGRAM = re.compile(r"^(\^+|\d+ \|.*)$")  # "^^^" markers and "1 | start: ..." excerpts


def add_structured_options(parser: argparse.ArgumentParser) -> None:
    """The constraint flags (one at a time), --max-whitespace and --token-healing."""
    group = parser.add_argument_group("structured outputs (at most one of the constraint options)")
    group.add_argument("--json-schema", default=None, metavar="FILE|JSON",
                       help="a JSON Schema: a .json file, or the schema as JSON text (starts with '{')")
    group.add_argument("--json-object", action="store_true", default=None, help="any JSON object")
    group.add_argument("--regex", default=None, help="the output matches this regular expression (whole output)")
    group.add_argument("--choice", action="append", default=None, metavar="A,B,C",
                       help="the output is one of these; repeatable; '\\,' is a literal comma")
    group.add_argument("--grammar", default=None, metavar="FILE",
                       help="grammar file: Lark if a line starts with 'start:', else GBNF (root rule 'root')")
    group.add_argument("--max-whitespace", type=int, default=None,
                       help="JSON: most whitespace characters between tokens (default 8; -1 = unbounded)")
    group.add_argument("--token-healing", action="store_true", default=None,
                       help="back up a prompt ending mid-token; the output starts with the removed text")


def structured_fields(args: argparse.Namespace) -> dict[str, object]:
    """SamplingParams fields of the structured options given: structured_outputs and token_healing.

    Raises ValueError naming the option: two constraints, an unreadable file, bad JSON, or a
    constraint that does not compile.
    """
    chosen = [name for name in CONSTRAINT_OPTIONS if getattr(args, name.replace("-", "_")) is not None]
    if len(chosen) > 1:
        raise ValueError(f"{', '.join('--' + name for name in chosen)} cannot be combined: give one constraint")
    if args.max_whitespace is not None and not (chosen and chosen[0] in ("json-schema", "json-object")):
        raise ValueError("--max-whitespace applies to --json-schema and --json-object only")
    fields: dict[str, object] = {}
    if args.token_healing:
        fields["token_healing"] = True
    if chosen:
        fields["structured_outputs"] = _compiled(chosen[0], _spec(chosen[0], args))
    return fields


def _spec(option: str, args: argparse.Namespace):
    from metagen.structured.spec import DEFAULT_MAX_WHITESPACE, StructuredOutputs

    field = f"--{option}"
    if option == "json-schema":
        kind = {"json": read_schema(args.json_schema)}
    elif option == "json-object":
        kind = {"json_object": True}
    elif option == "regex":
        kind = {"regex": args.regex}
    elif option == "choice":
        kind = {"choice": split_choices(args.choice)}
    else:
        kind = {"grammar": read_text(args.grammar, "--grammar")}
    whitespace = DEFAULT_MAX_WHITESPACE
    if args.max_whitespace is not None:
        if args.max_whitespace < -1:
            raise ValueError(f"--max-whitespace {args.max_whitespace} is out of range: >= 0, or -1 for no bound")
        whitespace = None if args.max_whitespace == -1 else args.max_whitespace
    return StructuredOutputs(**kind, max_whitespace=whitespace, field=field)


def _compiled(option: str, spec):
    """`spec` after llguidance compiled it; its error message names `--option` instead of a field path."""
    from metagen.structured.compile import check_compiles

    try:
        check_compiles(spec)
    except ValueError as error:
        message = one_line(str(error))
        if not message.startswith(f"--{option}"):
            message = f"--{option}: {message}"
        raise ValueError(message) from None
    return spec


def one_line(message: str) -> str:
    """llguidance's multi-line message on one line, without its caret and source-excerpt lines."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and not _DIAGRAM.match(line)]
    return " ".join(kept)


def read_schema(value: str) -> object:
    """--json-schema's value: JSON text when it starts with '{' (after spaces), else a file path."""
    if value.lstrip().startswith("{"):
        return _loads(value, "--json-schema (read as inline JSON text, since it starts with '{')")
    text = read_text(value, "--json-schema")
    return _loads(text, f"--json-schema file {value!r}")


def read_text(path: str, option: str) -> str:
    """The text of the file `path`, or ValueError naming `option` and the path."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{option} {path!r}: no such file (a file path was meant"
                         + ("; inline JSON must start with '{')" if option == "--json-schema" else ")"))
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{option} {path!r} cannot be read: {error}") from None


def _loads(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from None


def split_choices(values: list[str]) -> list[str]:
    """Repeated --choice values, each split at unescaped commas: ["a,b", "c\\,d"] -> ["a", "b", "c,d"].

    `\\,` is a literal comma and `\\\\` a literal backslash; empty choices are refused.
    """
    choices: list[str] = []
    for value in values:
        current, index = [], 0
        while index < len(value):
            char = value[index]
            if char == "\\" and index + 1 < len(value) and value[index + 1] in ",\\":
                current.append(value[index + 1])
                index += 2
                continue
            if char == ",":
                choices.append("".join(current))
                current = []
            else:
                current.append(char)
            index += 1
        choices.append("".join(current))
    empty = [i for i, choice in enumerate(choices) if not choice]
    if empty:
        raise ValueError(f"--choice {','.join(values)!r} has an empty choice (at position {empty[0] + 1}); "
                         "write a literal comma as '\\,'")
    return choices
