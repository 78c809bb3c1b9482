"""Parsing and checking of command-line values that argparse's types cannot express.

Every function raises ValueError naming the option and the value, so `metagen` reports a one-line
error instead of a traceback.
"""

from __future__ import annotations

import argparse
import re

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)


def unescape(text: str) -> str:
    """Interpret the usual backslash escapes, as C and llama.cpp's command line do.

    \\n \\t \\r \\0 \\\\ \\" \\' \\a \\b \\f \\v, \\xHH, \\uHHHH and \\UHHHHHHHH become their
    characters; any other backslash sequence is kept as typed (so "\\d" stays two characters).
    """

    def replace(match: re.Match) -> str:
        code = match.group(1)
        if code[0] in "xuU" and len(code) > 1:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, match.group(0))

    return _ESCAPE.sub(replace, text)


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """`--logit-bias ID=BIAS` values (repeatable) -> {token id: bias}; a token given twice is refused."""
    bias: dict[int, float] = {}
    for item in items:
        token, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--logit-bias {item!r} must look like TOKEN_ID=BIAS (e.g. 42=-5)")
        try:
            token_id = int(token)
        except ValueError:
            raise ValueError(f"--logit-bias {item!r}: token id {token!r} is not an integer") from None
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--logit-bias {item!r}: bias {value!r} is not a number") from None
        if token_id in bias:
            raise ValueError(f"--logit-bias gives token {token_id} twice ({bias[token_id]:g} and {number:g})")
        bias[token_id] = number
    return bias


def refuse_alone(args: argparse.Namespace, names, switch: str) -> None:
    """ValueError naming every option of `names` (attribute names) the command line set without
    the option they qualify (`switch`, as typed: "--speculative DRAFTER")."""
    given = [name for name in names if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in given)} only apply with {switch}")


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads} is out of range: must be >= 1 (omit it to use every core)")


def chat_prompt(args: argparse.Namespace):
    """The prompt, or the [system, user] messages with --system (which needs the chat template)."""
    if args.system is not None:
        if args.chat is False:
            raise ValueError("--system needs the chat template; drop --no-chat")
        return [{"role": "system", "content": args.system}, {"role": "user", "content": args.prompt}]
    return args.prompt
