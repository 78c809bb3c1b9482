"""Runs inside the sandbox (standard library only): load a candidate's program, run the tests'
statements, evaluate each checked expression and report its *value*. It never decides whether a
test passed: `CodeExecutionVerifier` compares the values with the expected ones outside the
sandbox, where the program cannot reach (see `code_checks`). This file is sent as the sandbox's
program text; the caller passes the payload on stdin:

    {"setup": str, "program": str, "timeout": seconds per test, "value_limit": characters,
     "tests": [[step, ...], ...]}   step: {"exec": statement} | {"eval": expression, "check": k}

(value_limit: most bytes of one record line; a larger value is reported as an error)

and reads one JSON record per line from the sandbox's stdout (the harness keeps a private copy
of fd 1; what the program writes to fd 1 goes to stderr):

    {"stage": "program", "compiles": bool, "error": traceback | null}
    {"check": k, "value": encoded value}   (see `encode`)
    {"test": t, "error": traceback}        test t stopped here (its later steps did not run)

Everything here shares a process with the program, which may rewrite any of it: the caller
trusts none of these records beyond "the program's process claims this value".
"""

import io
import json
import linecache
import os
import signal
import sys
import traceback

MAX_DEPTH = 64  # nesting levels of a reported value


def encode(value, budget: list[int], depth: int = 0):
    """`value` as JSON data: None, bool, int, float and str as themselves, a list as a list;
    a tuple, set, frozenset, dict (as [key, value] pairs), bytes (hex) or complex as a one-key
    object {"tuple": [...]} etc. Subclasses count as their base type (their own methods are not
    called). Anything else raises TypeError; more than budget[0] characters or MAX_DEPTH levels
    raise ValueError."""
    budget[0] -= len(value) if isinstance(value, (str, bytes, bytearray)) else 1
    if budget[0] < 0:
        raise ValueError("the value is too large to report")
    if depth > MAX_DEPTH:
        raise ValueError(f"the value is nested deeper than {MAX_DEPTH} levels")
    if value is None or type(value) is bool:
        return value
    if isinstance(value, int):
        if value.bit_length() > 14_000:  # JSON holds at most 4300 decimal digits
            raise ValueError("the integer is too large to report")
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [complex.real.__get__(value), complex.imag.__get__(value)]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in dict.items(value)]}
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            items = [encode(item, budget, depth + 1) for item in kind.__iter__(value)]
            return items if kind is list else {kind.__name__: items}
    raise TypeError(f"a value of type {type(value).__name__} cannot be reported: only None, bool, int, "
                    "float, complex, str, bytes and lists, tuples, sets and dicts of them can")


def _traceback(error: BaseException) -> str:
    """The error as traceback text, without the harness's own frames."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != "main.py"]
    head = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] if frames else []
    text = "".join(head + traceback.format_exception_only(type(error), error))
    return text if len(text) <= 4000 else "..." + text[-4000:]


def main() -> None:
    payload = json.loads(sys.stdin.read())
    channel = os.dup(1)  # records go here, even if the program closes or replaces fd 1
    os.dup2(2, 1)
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), io.StringIO(), io.StringIO()
    limit, value_limit = payload["timeout"], payload["value_limit"]

    def emit(record) -> None:
        data = (json.dumps(record) + "\n").encode()
        if len(data) > value_limit:
            raise ValueError(f"the value is too large to report ({len(data)} bytes of JSON)")
        paused = signal.setitimer(signal.ITIMER_REAL, 0)[0]  # no alarm in the middle of a line
        while data:
            data = data[os.write(channel, data):]
        if paused:
            signal.setitimer(signal.ITIMER_REAL, paused)

    def alarm(signum, frame):
        raise TimeoutError(f"took longer than {limit:g} s")

    def run(source: str, filename: str) -> str | None:
        """Run a whole file under its own alarm: None, or its error as traceback text."""
        try:
            code = compile(source, filename, "exec")
        except (SyntaxError, ValueError) as error:
            return "".join(traceback.format_exception_only(type(error), error))
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            exec(code, namespace)
            return None
        except BaseException as error:  # SystemExit, KeyboardInterrupt and TimeoutError included
            signal.setitimer(signal.ITIMER_REAL, 0)
            return _traceback(error)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    signal.signal(signal.SIGALRM, alarm)
    for name, text in (("setup.py", payload["setup"]), ("solution.py", payload["program"])):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    if payload["setup"].strip():
        error = run(payload["setup"], "setup.py")
        if error is not None:
            emit({"stage": "program", "compiles": True, "error": "the verifier's setup code failed:\n" + error})
            return
    try:
        compile(payload["program"], "solution.py", "exec")
        compiles = True
    except (SyntaxError, ValueError):
        compiles = False
    emit({"stage": "program", "compiles": compiles, "error": run(payload["program"], "solution.py")})
    if compiles:
        for index, steps in enumerate(payload["tests"]):
            _run_test(index, steps, namespace, limit, value_limit, emit)


def _run_test(index: int, steps: list[dict], namespace: dict, limit: float, value_limit: int, emit) -> None:
    """Run one test's steps in order under one alarm; report each checked value, or the error
    that stopped the test."""
    filename = f"test_{index + 1}.py"
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        for step in steps:
            if "exec" in step:
                exec(compile(step["exec"], filename, "exec"), namespace)
                continue
            value = eval(compile(step["eval"], filename, "eval"), namespace)
            try:
                encoded = encode(value, [value_limit])
            except (TypeError, ValueError, RecursionError) as error:
                raise ValueError(f"{step['eval'].strip()}: {error}") from None
            emit({"check": step["check"], "value": encoded})
    except BaseException as error:  # the test stops at its first error, as a Python test would
        signal.setitimer(signal.ITIMER_REAL, 0)
        emit({"test": index, "error": _traceback(error)})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


if __name__ == "__main__":
    main()
