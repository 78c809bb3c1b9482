"""Runs inside the sandbox (standard library only): a code problem's program, then its hidden
tests, then `check(entry point)`. This file is sent as the sandbox's program text; the caller
(`code_grading`) passes on stdin

    {"nonce": str, "program": str, "test": str, "entry_point": str}

and reads from stdout, a private copy of fd 1 (what the program writes to fd 1 goes to stderr):

    {"reason": text}    why the run failed: the program's claim, read as information only
    nonce               written only after check() returned

The program runs as module "solution" (its `if __name__ == "__main__":` block does not run, stdin
is empty), the tests in the same namespace (they may call the prompt's helper functions), as
HumanEval's own harness runs them.
"""

import io
import json
import linecache
import os
import sys
import traceback

REASON_CHARS = 400


def describe(error: BaseException, files: tuple[str, ...]) -> str:
    """One line: the error, and the last line of the program or the tests it passed through
    ("AssertionError at test.py line 9: assert candidate(2) == 4")."""
    lines = traceback.format_exception_only(type(error), error)
    head = lines[-1].strip() if lines else type(error).__name__
    if isinstance(error, SyntaxError):
        where = f" at {error.filename} line {error.lineno}" if error.lineno else ""
        text = head + where
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename in files]
        text = head if not frames else f"{head} at {frames[-1].filename} line {frames[-1].lineno}: " + \
            (frames[-1].line or "").strip()
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "..."


def main() -> None:
    payload = json.loads(sys.stdin.read())
    nonce, entry_point = payload.pop("nonce"), payload["entry_point"]
    channel = os.dup(1)  # the report goes here, whatever the program does to fd 1
    os.dup2(2, 1)
    sys.stdin = io.StringIO("")

    def report(line: str) -> None:
        data = (line + "\n").encode()
        while data:
            data = data[os.write(channel, data):]

    files = ("solution.py", "test.py")
    for name, text in zip(files, (payload["program"], payload["test"])):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(payload["program"], "solution.py", "exec"), namespace)
        if not callable(namespace.get(entry_point)):
            report(json.dumps({"reason": f"the program defines no function {entry_point!r}"}))
            return
        exec(compile(payload["test"], "test.py", "exec"), namespace)
        namespace["check"](namespace[entry_point])
    except BaseException as error:  # SystemExit and KeyboardInterrupt included: a failure
        report(json.dumps({"reason": describe(error, files)}))
        return
    report(nonce)


if __name__ == "__main__":
    main()
