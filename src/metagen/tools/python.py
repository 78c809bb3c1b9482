"""A Python interpreter tool: runs the model's code in the sandbox, answers with what it printed.

    PythonTool()("print(sum(range(10)))")   # "45"
    PythonTool()("x = 6\nx * 7")             # "42": a final expression's value is printed (REPL style)
    PythonTool()("1 / 0")                    # "error: ZeroDivisionError: division by zero"

Each call is a fresh sandboxed process (`metagen.tools.sandbox.run_python`): no state carries
over between calls, only the standard library is importable, and there is no network. Code in a
```python fence is taken from inside the fence (`extract_program`, which the code-execution
verifier shares): the last ```python (or ```py / ```python3) fenced block of the text; without one,
the last untagged ``` block; without any fence, the whole text. A block cut off by the token limit
(no closing fence) counts up to the end of the text.
"""

from __future__ import annotations

import ast
import re

from metagen.tools.base import ERROR_PREFIX, Tool
from metagen.tools.sandbox import run_python

# A fence line: ``` then its tag, then (after a character no tag has) anything to the newline. The
# tag and the rest of the line never compete for the same characters, so a long first line without
# a newline is read once, not tried at every split (O(L) instead of O(L^2)).
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)(?:[^\w+\-\n][^\n]*)?\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)",
                   re.DOTALL | re.MULTILINE)
PYTHON_TAGS = ("python", "py", "python3")


def extract_program(text: str) -> str | None:
    """The program in a model's answer (see the module docstring), or None when there is none."""
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(text)]
    if blocks:
        python = [body for tag, body in blocks if tag in PYTHON_TAGS] or [body for tag, body in blocks if not tag]
        program = python[-1] if python else ""
    else:
        program = text
    return program if program.strip() else None



def _print_last_expression(code: str) -> str:
    """`code` with its final expression statement (if any) replaced by printing its repr when it
    is not None, as an interactive interpreter does."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code  # the sandbox reports the error
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    lines = code.splitlines(keepends=True)
    head = "".join(lines[: last.lineno - 1]) + lines[last.lineno - 1][: last.col_offset]
    expression = ast.get_source_segment(code, last.value)
    return f"{head}\n__value = ({expression})\nif __value is not None:\n    print(repr(__value))\n"


class PythonTool(Tool):
    """Runs Python code in the sandbox; the answer is its stdout (clipped to `max_chars`), or
    "error: <last line of the traceback>" / "error: timeout ..." after whatever it printed first,
    or "(no output)".

    timeout: wall-clock seconds per call; memory_mb: the sandbox's memory limit.
    """

    name = "python"
    description = (
        "Runs a Python program (standard library only, no network, no state between calls) and "
        "returns what it prints; the value of a final expression is printed."
    )

    def __init__(self, *, timeout: float = 5.0, memory_mb: int = 256, max_chars: int = 2000, isolation: str = "auto") -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars={max_chars!r} is out of range: must be an int >= 1")
        self.timeout, self.memory_mb, self.max_chars, self.isolation = timeout, memory_mb, max_chars, isolation

    def run(self, text: str) -> str:
        code = extract_program(text)
        if code is None:
            return ERROR_PREFIX + "no code to run"
        result = run_python(_print_last_expression(code), timeout=self.timeout, memory_mb=self.memory_mb,
                            max_output_bytes=4 * self.max_chars, isolation=self.isolation)
        output = result.stdout
        if result.status != "ok":
            lines = result.stderr.strip().splitlines()
            reason = lines[-1] if result.status in ("error", "memory") and lines else f"{result.status} ({result.detail})"
            output += ERROR_PREFIX + reason
        output = output.rstrip("\n") or "(no output)"
        if len(output) > self.max_chars:
            output = output[: self.max_chars] + f"\n... ({len(output) - self.max_chars} more characters)"
        return output
