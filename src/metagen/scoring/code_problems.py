"""Code problems in HumanEval's form: a prompt holding a function's signature and docstring, and
the program a model's reply makes of it.

A code problem's prompt is Python source that ends with the function to write (`entry point`:
the last top-level `def`, or the name given), its body left out. A model answers it in one of
two ways, and `build_program` turns either into the program that is run:

  - completion-style (a base model continues the source): the reply is the function's body,
    so the program is the prompt followed by the reply;
  - chat-style (an instruct model answers a request showing the code): the reply holds a
    fenced block (or, without a fence, is code) defining the entry point itself, so the program
    is the prompt followed by that code, which redefines the function. Keeping the prompt in
    front keeps its imports and helper functions (HumanEval/38's `encode_cyclic`), which
    replies often leave out; when prompt + code does not compile, the code alone is used.

`code_in_prompt` finds the source in a prompt text (the last fenced Python block of a chat
request, else the whole text), so a strategy or value that sees only the prompt — never the
problem's hidden tests — can build the same programs and read the docstring's examples.
"""

from __future__ import annotations

import ast
import re

from metagen.tools.python import FENCE, PYTHON_TAGS, extract_program

_DEF = re.compile(r"^def[ \t]+([A-Za-z_]\w*)[ \t]*\(", re.MULTILINE)


def code_in_prompt(text: str) -> str:
    """The Python source a prompt shows: its last ```python (or untagged) fenced block, else the
    whole text."""
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(text)]
    python = [body for tag, body in blocks if tag in PYTHON_TAGS] or [body for tag, body in blocks if not tag]
    return python[-1] if python else text


def entry_point_of(code: str) -> str | None:
    """The name of the last top-level function defined in `code` (HumanEval's entry point is the
    function left to write, which comes last), or None when it defines none."""
    names = _DEF.findall(code)
    return names[-1] if names else None


def function_names(code: str) -> list[str]:
    """The names of the top-level functions `code` defines, in order."""
    return _DEF.findall(code)


def defines(code: str, name: str) -> bool:
    """Whether `code` has a top-level `def name(`."""
    return name in _DEF.findall(code)


def build_program(prompt_code: str, reply: str, entry_point: str | None = None) -> str | None:
    """The program a reply makes of a code problem (see the module docstring), or None when the
    reply holds no code. entry_point: the function to write (default: `entry_point_of`)."""
    name = entry_point or entry_point_of(prompt_code)
    code = extract_program(reply)
    if code is None:
        return None
    if name is not None and defines(code, name):
        joined = prompt_code.rstrip() + "\n\n\n" + code
        return joined if _compiles(joined) else code
    if "```" in reply:  # a fenced answer that does not define the function: run what it holds
        return prompt_code.rstrip() + "\n\n\n" + code
    return prompt_code + reply


def _compiles(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: source holding a NUL byte
        return False
    return True
