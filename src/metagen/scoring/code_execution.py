"""Code-execution verification: run the candidate's program against tests in the sandbox.

    verifier = CodeExecutionVerifier(["assert square(2) == 4", "assert square(-3) == 9"])
    verdict = verifier.verify(prompt, candidate)   # passed, score = share of tests passed, feedback

Which code is run (`extract_program`): the last ```python (or ```py / ```python3) fenced block
of the text; without one, the last untagged ``` block; without any fence, the whole text. A
block cut off by the token limit (no closing fence) counts up to the end of the text.

One sandbox run per candidate (cost: zero model calls; wall time measured). Inside it a harness
runs `setup`, then the program as module "solution" (so `if __name__ == "__main__":` blocks do
not run, and stdin is empty), then each test in the same namespace, each under its own alarm of
`timeout` seconds and inside try/except BaseException, so a failing test, `sys.exit()` or a
hanging test cannot hide the results of the others. The harness writes one JSON line per stage to
a private duplicate of stdout, each prefixed with a random nonce, so text the program prints
cannot be mistaken for a result. A program that kills its own process (`os._exit`) or exhausts
the sandbox's limits leaves the tests without a record; they count as failed, with the sandbox's
verdict (timeout, memory, ...) as the reason.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.scoring.base import Verdict, Verifier
from metagen.scoring.sandbox import run_python

if TYPE_CHECKING:
    from metagen.decoding.prompts import Prompt
    from metagen.strategies.result import Candidate

FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
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


def _clip(text: str, limit: int) -> str:
    """The end of `text` (where a traceback says what went wrong), at most `limit` characters."""
    return text if len(text) <= limit else "..." + text[-limit:]


class CodeExecutionVerifier(Verifier):
    """Passes when every test passes; score = share of tests passed; feedback = each failing test
    with its error (clipped), or why the program never got to run the tests.

    tests: one test (a string, which may hold several statements) or a list of them, e.g.
        "assert f(2) == 4"; run in the program's namespace.
    timeout: seconds per stage (setup + program, and each test); the whole run gets
        timeout × (tests + 1) plus interpreter start-up. memory_mb: the sandbox's RLIMIT_AS.
    setup: code run before the program (imports, helpers the tests use).
    feedback_chars: most characters of error text kept per failing test.
    """

    name = "code_execution"

    def __init__(
        self,
        tests: str | Sequence[str],
        *,
        timeout: float = 5.0,
        memory_mb: int = 512,
        setup: str = "",
        isolation: str = "auto",
        feedback_chars: int = 600,
    ) -> None:
        self.tests = [tests] if isinstance(tests, str) else [str(test) for test in tests]
        if not self.tests or not all(test.strip() for test in self.tests):
            raise ValueError(f"tests={tests!r} must be a non-empty test or a list of non-empty tests")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"timeout={timeout!r} is out of range: must be a number > 0")
        if isinstance(feedback_chars, bool) or not isinstance(feedback_chars, int) or feedback_chars < 40:
            raise ValueError(f"feedback_chars={feedback_chars!r} is out of range: must be an int >= 40")
        self.timeout, self.memory_mb, self.setup = float(timeout), memory_mb, setup
        self.isolation, self.feedback_chars = isolation, feedback_chars

    def verify(self, prompt: Prompt, candidate: Candidate) -> Verdict:
        program = extract_program(candidate.text)
        if program is None:
            return Verdict(False, 0.0, "No Python code was found in the response.")
        nonce = secrets.token_hex(16)
        payload = {"nonce": nonce, "setup": self.setup, "program": program, "tests": self.tests, "timeout": self.timeout}
        harness = _HARNESS.replace("PAYLOAD", repr(json.dumps(payload)))
        budget = self.timeout * (len(self.tests) + 1) + 2.0  # + interpreter start-up
        run = run_python(harness, timeout=budget, memory_mb=self.memory_mb, isolation=self.isolation)
        records = [json.loads(line[len(nonce):]) for line in run.stdout.splitlines() if line.startswith(nonce)]
        loaded = next((r for r in records if r.get("stage") == "program"), None)
        program_error = loaded["error"].rstrip() if loaded and loaded["error"] else None
        test_errors = {r["test"]: r["error"] and r["error"].rstrip() for r in records if "test" in r}
        if loaded is None:
            why = f"the program did not finish loading ({_ended(run)})"
        elif not loaded["compiles"]:
            why = "the program does not compile"
        else:
            why = f"the run stopped before this test ({_ended(run)})"
        failures = []
        for index, test in enumerate(self.tests):
            if index not in test_errors:
                failures.append(f"NOT RUN {test.strip()}\n  {why}")
            elif test_errors[index] is not None:
                failures.append(f"FAILED {test.strip()}\n  " + _clip(test_errors[index], self.feedback_chars).replace("\n", "\n  "))
        passed = len(self.tests) - len(failures)
        lines = [f"{passed} of {len(self.tests)} tests passed."]
        if program_error is not None:
            what = "raised an error while loading" if loaded["compiles"] else "does not compile"
            lines.append(f"The program {what}:\n  " + _clip(program_error, self.feedback_chars).replace("\n", "\n  "))
        feedback = "\n".join(lines + failures).rstrip()
        return Verdict(not failures, passed / len(self.tests), feedback, Cost(wall_seconds=run.wall_seconds))


def _ended(run) -> str:
    if run.status in ("timeout", "memory", "output_limit", "killed"):
        return f"{run.status}: {run.detail}"
    return f"the process exited with code {run.returncode}"


# The program run in the sandbox. PAYLOAD becomes a string literal holding the JSON payload.
_HARNESS = r'''
import io, json, linecache, os, signal, sys, traceback

def _harness(payload):
    nonce, limit = payload["nonce"], payload["timeout"]
    channel = os.fdopen(os.dup(1), "w")  # ours even if the program closes or replaces stdout

    def emit(record):
        channel.write(nonce + json.dumps(record) + "\n")
        channel.flush()

    def alarm(signum, frame):
        raise TimeoutError(f"took longer than {limit:g} s")

    namespace = {"__name__": "solution", "__builtins__": __builtins__}

    def run(source, filename):
        """None when `source` ran, else its error as traceback text."""
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            code = compile(source, filename, "exec")
        except (SyntaxError, ValueError) as error:
            return "".join(traceback.format_exception_only(type(error), error))
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            exec(code, namespace)
            return None
        except BaseException as error:  # SystemExit and KeyboardInterrupt included
            signal.setitimer(signal.ITIMER_REAL, 0)
            frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != "main.py"]
            lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] if frames else []
            return "".join(lines + traceback.format_exception_only(type(error), error))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    sys.stdin, sys.stdout = io.StringIO(""), io.StringIO()
    if payload["setup"].strip():
        error = run(payload["setup"], "setup.py")
        if error is not None:
            emit({"stage": "program", "error": "the verifier's setup code failed:\n" + error, "compiles": True})
            return
    try:
        compile(payload["program"], "solution.py", "exec")
        compiles = True
    except (SyntaxError, ValueError):
        compiles = False
    emit({"stage": "program", "error": run(payload["program"], "solution.py"), "compiles": compiles})
    if compiles:
        for index, test in enumerate(payload["tests"]):
            emit({"test": index, "error": run(test, f"test_{index + 1}.py")})

_harness(json.loads(PAYLOAD))
'''
