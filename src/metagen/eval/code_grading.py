"""Grading a reply to a code problem by running the problem's hidden tests (HumanEval's way).

    grade(problem, reply) -> Grade(passed, reason, program, seconds)

The program is `build_program(problem.question, reply, problem.entry_point)` (the one rule of
`scoring/code_problems`: a completion-style reply is the function's body, a chat-style one
holds the whole function); the runner (`code_runner`, in metagen's sandbox, `run_python`,
under a wall-clock and CPU limit of `timeout` seconds and an address-space limit of
`memory_mb`) runs the program, then the problem's `test` source, then `check(entry_point)`.
One sandbox run per distinct reply: about 0.15 s of start-up plus the tests' own time.

What counts as passing: check() returned. The exit code is not trusted (a program calling
`os._exit(0)` or `sys.exit(0)` while it is imported ends with code 0, having checked nothing):
the grader draws a random nonce per run (`secrets.token_hex`), hands it to the runner on stdin,
and the runner writes it to its private copy of fd 1 only after check() returned; the run
passes when it ended normally and that line is there. Everything else is a failure with its
reason ("no code", "timeout: ...", "AssertionError at test.py line 9: assert ...", "SyntaxError:
... at solution.py line 3", "the program ended the run before check() returned (exit code
0)"); a failing program never raises. Only a sandbox that cannot be set up at all raises
(`SandboxError`), as that says nothing about the program.

Residual risk: the program shares its process with the runner. One that introspects the
runner (its frames, `sys.modules["__main__"]`) can read the nonce and print it, or patch what
the runner calls (`exec`, `check`), and one returning an object whose `__eq__` always says True
passes asserts of the form `candidate(x) == y`; HumanEval's own harness has the same exposure.
The grader stops the failures of ordinary programs and careless escapes (exiting early,
killing the process, printing "passed", hanging, exhausting memory), not a program written to
attack this runner. The tests themselves reach only the sandbox, never a strategy (which sees
the prompt alone).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metagen.eval.tasks import Problem
from metagen.scoring.code_problems import build_program
from metagen.tools.sandbox import run_python

RUNNER = (Path(__file__).parent / "code_runner.py").read_text(encoding="utf-8")
TIMEOUT = 10.0  # seconds per run (HumanEval's harness allows 3 s per problem; start-up included here)
MEMORY_MB = 512


@dataclass(frozen=True)
class Grade:
    """passed: check() returned; reason: "passed" or why not (one line); program: what was run
    (None when the reply holds no code); seconds: the sandbox run's wall time (0 without a run)."""

    passed: bool
    reason: str
    program: str | None
    seconds: float


def grade(problem: Problem, reply: str, *, timeout: float = TIMEOUT, memory_mb: int = MEMORY_MB,
          isolation: str = "auto") -> Grade:
    """Run `reply`'s program against `problem`'s hidden tests (see the module docstring)."""
    if not problem.is_code:
        raise ValueError(f"problem {problem.id!r} is not a code problem (it has no 'test'): grade its answer instead")
    program = build_program(problem.question, reply, problem.entry_point)
    if program is None:
        return Grade(False, "no code", None, 0.0)
    nonce = secrets.token_hex(16)
    payload = {"nonce": nonce, "program": program, "test": problem.test, "entry_point": problem.entry_point}
    run = run_python(RUNNER, stdin=json.dumps(payload), timeout=timeout, memory_mb=memory_mb, isolation=isolation)
    lines = run.stdout.splitlines()
    if run.ok and nonce in lines:
        return Grade(True, "passed", program, run.wall_seconds)
    return Grade(False, _reason(run, lines), program, run.wall_seconds)


def _reason(run, lines: list[str]) -> str:
    """Why a run failed: the sandbox's verdict when it stopped the run, else the runner's report."""
    if run.status in ("timeout", "memory", "output_limit", "killed"):
        return f"{run.status}: {run.detail}"
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("reason"), str):
            return record["reason"]
    return f"the program ended the run before check() returned (exit code {run.returncode})"


def grade_all(problem: Problem, replies: Sequence[str], *, timeout: float = TIMEOUT, memory_mb: int = MEMORY_MB,
              workers: int | None = None) -> list[Grade]:
    """`grade` of each reply, equal replies run once, up to `workers` sandbox runs at once
    (default: min(4, CPUs)); in the order of `replies`."""
    from concurrent.futures import ThreadPoolExecutor

    distinct = list(dict.fromkeys(replies))
    workers = workers or min(4, os.cpu_count() or 1)
    if workers == 1 or len(distinct) == 1:
        graded = [grade(problem, reply, timeout=timeout, memory_mb=memory_mb) for reply in distinct]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(distinct)), thread_name_prefix="metagen-grade") as pool:
            graded = list(pool.map(lambda reply: grade(problem, reply, timeout=timeout, memory_mb=memory_mb), distinct))
    by_reply = dict(zip(distinct, graded))
    return [by_reply[reply] for reply in replies]
