"""Code-execution verification: run the candidate's program against tests in the sandbox.

    verifier = CodeExecutionVerifier(["assert square(2) == 4", "assert square(-3) == 9"])
    verdict = verifier.verify(prompt, candidate)   # passed, score = share of tests passed, feedback

Which code is run: `extract_program` (`metagen.tools.python`, shared with the Python tool).

Where the verdict comes from: the program under test is hostile until proven otherwise (a
verifier-guided strategy selects whatever the verdict rewards), and it shares its process with
whatever runs in the sandbox, so nothing in that process may decide that a test passed. Each
assert of a test is split (`code_checks`) into the expression the program computes, E, and the
expected side, a literal L. One sandbox run per candidate (cost: zero model calls; wall time
measured): a harness (`code_harness`) runs `setup`, then the program as module "solution" (so
`if __name__ == "__main__":` blocks do not run, and stdin is empty), then each test's
statements, and reports the *value* of each E as JSON, each test under its own alarm of
`timeout` seconds. L never enters the sandbox; the caller rebuilds each value as plain Python
data (`code_report`) and compares it with L itself. So a program that walks the stack into the
harness, writes records of its own, closes or replaces file descriptors, exits early, kills its
parent or returns an object whose `__eq__` always says True gains nothing: a check passes only
when a value equal to the hidden L was reported for it. A check without a value (the program
exited, crashed, hung, ran out of memory or output) fails, with the sandbox's verdict as the
reason; a report that only the program can have garbled (a malformed, unknown or repeated
record) fails the whole candidate with score 0. Tests that cannot be split this way (asserts
on the test's own logic, asserts inside loops or functions) are refused when the verifier is
built; see `code_checks` for the accepted forms.

L is out of reach as long as the program cannot read it elsewhere: under namespace isolation
the host's data directories and the caller's process are out of sight (see `sandbox`); in the
audit-hook fallback the hook refuses the caller's /proc files, but the program may read any
file its uid may read, so expected answers must not lie in such a file there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.scoring.base import Verdict, Verifier
from metagen.scoring.code_checks import plan_tests
from metagen.scoring.code_report import Report, read_report
from metagen.tools.python import extract_program
from metagen.tools.sandbox import SandboxResult, run_python

if TYPE_CHECKING:
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion

HARNESS = (Path(__file__).parent / "code_harness.py").read_text(encoding="utf-8")
RECORD_CHARS = 50_000  # longest record line the harness writes (a value, or an error's traceback)

class CodeExecutionVerifier(Verifier):
    """Passes when every test passes; score = share of tests passed; feedback = each failing test
    with the value it got or its error (clipped), or why the program never got to run the tests.

    tests: one test (a string, which may hold several statements) or a list of them, e.g.
        "assert f(2) == 4"; its asserts must have a form `code_checks` accepts (ValueError if not).
    timeout: seconds per stage (setup + program, and each test); the whole run gets
        timeout × (tests + 1) plus interpreter start-up. memory_mb: the sandbox's RLIMIT_AS.
    setup: code run before the program (imports, helpers the tests use).
    isolation: the sandbox's isolation mode (see `sandbox.run_python`).
    feedback_chars: most characters of error text kept per failing test.
    program: the program a candidate's text makes (None: it holds no code); default
        `extract_program`, for a code problem's prompt `code_problems.build_program` bound to it.
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
        program: Callable[[str], str | None] = extract_program,
    ) -> None:
        self.tests = [tests] if isinstance(tests, str) else [str(test) for test in tests]
        if not self.tests or not all(test.strip() for test in self.tests):
            raise ValueError(f"tests={tests!r} must be a non-empty test or a list of non-empty tests")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"timeout={timeout!r} is out of range: must be a number > 0")
        if isinstance(feedback_chars, bool) or not isinstance(feedback_chars, int) or feedback_chars < 40:
            raise ValueError(f"feedback_chars={feedback_chars!r} is out of range: must be an int >= 40")
        self.steps, self.checks = plan_tests(self.tests, setup)
        self.checks_of = [[k for k, check in enumerate(self.checks) if check.test == t] for t in range(len(self.tests))]
        self.timeout, self.memory_mb, self.setup = float(timeout), memory_mb, setup
        self.isolation, self.feedback_chars, self.program = isolation, feedback_chars, program

    def verify(self, prompt: Prompt, candidate: Completion) -> Verdict:
        program = self.program(candidate.text)
        if program is None:
            return Verdict(False, 0.0, "No Python code was found in the response.")
        report, run = self.execute(program)
        return self.judge(report, run)

    def execute(self, program: str) -> tuple[Report, SandboxResult]:
        """One sandbox run of `program` on the tests: the report of the values it claims (read
        by `code_report`, trusting none of it) and how the run ended (its wall seconds)."""
        payload = {"setup": self.setup, "program": program, "tests": self.steps, "timeout": self.timeout,
                   "value_limit": RECORD_CHARS}
        run = run_python(
            HARNESS, stdin=json.dumps(payload), isolation=self.isolation, memory_mb=self.memory_mb,
            timeout=self.timeout * (len(self.tests) + 1) + 2.0,  # + interpreter start-up
            max_output_bytes=(RECORD_CHARS + 100) * (len(self.checks) + len(self.tests) + 1),
        )
        return self.report_of(run), run

    def report_of(self, run: SandboxResult) -> Report:
        """The report a run of the harness on these tests wrote (`code_report.read_report`)."""
        return read_report(run.stdout, len(self.tests), len(self.checks))

    def judge(self, report: Report, run: SandboxResult) -> Verdict:
        """The verdict on a run (`execute`): each reported value compared with its expected one here."""
        cost = Cost(wall_seconds=run.wall_seconds, sandbox_seconds=run.cpu_seconds)
        if report.problem is not None:
            feedback = (f"0 of {len(self.tests)} tests passed.\nThe run cannot be trusted: {report.problem}. "
                        "The program wrote to the verifier's report channel.")
            return Verdict(False, 0.0, feedback, cost)
        failures = [text for index in range(len(self.tests)) if (text := self._failure(index, report, run))]
        passed = len(self.tests) - len(failures)
        lines = [f"{passed} of {len(self.tests)} tests passed."]
        loaded = report.program
        if loaded is not None and loaded["error"] is not None:
            what = "raised an error while loading" if loaded["compiles"] else "does not compile"
            lines.append(f"The program {what}:\n  " + self._clip(loaded["error"]))
        feedback = "\n".join(lines + failures).rstrip()
        return Verdict(not failures, passed / len(self.tests), feedback, cost)

    def _failure(self, index: int, report, run) -> str | None:
        """Why test `index` failed (its error, the values that did not match, or why its checks
        got no value), or None when it passed."""
        header = self.tests[index].strip()
        if index in report.errors:
            return f"FAILED {header}\n  " + self._clip(report.errors[index])
        reasons, missing = [], False
        for number in self.checks_of[index]:
            check = self.checks[number]
            if number not in report.values:
                missing = True
                continue
            value = report.values[number]
            try:
                why = None if check.holds(value) else ""
            except Exception as error:  # noqa: BLE001 - a value that cannot be compared (e.g. 1 < "a")
                why = f", which cannot be compared: {type(error).__name__}: {error}"
            if why is not None:
                reasons.append(f"line {check.line}: {check.expression} returned {_shorten(repr(value))}{why}")
        if missing and not reasons:
            return f"NOT RUN {header}\n  {_not_run(report, run)}"
        if missing:
            reasons.append(f"later checks got no value: {_not_run(report, run)}")
        return f"FAILED {header}\n  " + self._clip("\n".join(reasons)) if reasons else None

    def _clip(self, text: str) -> str:
        return _clip(text.rstrip(), self.feedback_chars).replace("\n", "\n  ")


def _not_run(report, run) -> str:
    """Why a check has no value."""
    if report.program is None:
        return f"the program did not finish loading ({_ended(run)})"
    if not report.program["compiles"]:
        return "the program does not compile"
    return f"the run stopped before this test ({_ended(run)})"


def _clip(text: str, limit: int) -> str:
    """The end of `text` (where a traceback says what went wrong), at most `limit` characters."""
    return text if len(text) <= limit else "..." + text[-limit:]


def _shorten(text: str, limit: int = 200) -> str:
    """The start of `text` (a value's repr), at most `limit` characters."""
    return text if len(text) <= limit else text[:limit] + "..."


def _ended(run) -> str:
    if run.status in ("timeout", "memory", "output_limit", "killed"):
        return f"{run.status}: {run.detail}"
    return f"the process exited with code {run.returncode}"
