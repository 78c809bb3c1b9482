"""A code problem's docstring examples as a verifier, a value and a clustering key, from its
prompt alone (the problem's hidden tests never reach a strategy).

    tests = ExampleTests(prompt_text)      # the examples of the prompt's code (`doc_examples`)
    score, cost = tests.score(reply)       # share of the examples passed; None: the prompt has none
    key, cost = tests.cluster_key(reply)   # its outcome on every example's call; None: no cluster
    scores = ExampleScorer(tests)(prompt, candidates)   # as a `Scorer` (best-of-N)

cost: what the run spent (sandbox wall and CPU seconds; no model call, no FLOPs).

The program is `code_problems.build_program(prompt code, reply)`; it runs once in the sandbox on
all the examples (`CodeExecutionVerifier`, each example `assert (call) == expected`, the expected
value kept out of the sandbox). Its score is passed / examples. A problem without examples has
no score (None), not 0 or 1: the caller decides what to do without one. A reply without code
passes none of the examples (0.0).

The clustering key (AlphaCode, Li et al. 2022) reads the values the program computes for the
examples' calls, never the expected values: per example "= <value>" (the value rebuilt as plain
data by `code_report`, written canonically: sets and dicts sorted, so no object of the program
takes part in the comparison), "raised <exception type>" (TimeoutError for one over its time)
or "no value (<how the run ended>)"; the key is a digest of that tuple (lower-case hex, so answer
matching keeps it as is). A reply without code, or whose program does not load, gets None (it
joins no cluster). Without examples the key is a digest of the program's normalized text
(`ast.unparse`: comments and layout ignored), so voting falls back to a majority over programs.

Runs are cached (`run_cache`: in memory per process, and in a file inside `stored_runs`, which
`metagen eval --out` keeps as sandbox_runs.jsonl): scoring the same program again (the
evaluation harness scores many subsets of one sample pool) reuses the run and counts its
measured seconds again, as an independent run would spend them.
Cost: one sandbox start-up (~0.15 s) plus the program's own time per distinct program.
"""

from __future__ import annotations

import ast
import hashlib
from functools import partial

from metagen.decoding.cost import Cost
from metagen.scoring.base import Scorer, Scores
from metagen.scoring.code_execution import CodeExecutionVerifier
from metagen.scoring.code_problems import build_program, code_in_prompt, entry_point_of
from metagen.scoring.doc_examples import doc_examples
from metagen.scoring.run_cache import cached_run


class ExampleTests:
    """The docstring examples of the code problem in `prompt_text` (see the module docstring);
    timeout: seconds per example (and for loading the program); memory_mb, isolation: the
    sandbox's (`sandbox.run_python`)."""

    def __init__(self, prompt_text: str, *, timeout: float = 5.0, memory_mb: int = 512,
                 isolation: str = "auto") -> None:
        self.code = code_in_prompt(prompt_text)
        self.entry_point = entry_point_of(self.code)
        self.found = doc_examples(self.code, self.entry_point)
        self.examples = self.found.examples
        make_program = partial(build_program, self.code, entry_point=self.entry_point)
        self.verifier = (CodeExecutionVerifier([example.test() for example in self.examples], timeout=timeout,
                                               memory_mb=memory_mb, isolation=isolation, program=make_program)
                         if self.examples else None)
        self.program = make_program

    def score(self, reply: str) -> tuple[float | None, Cost]:
        """(share of the examples the reply's program passes, cost); None when the problem has none."""
        if self.verifier is None:
            return None, Cost()
        program = self.program(reply)
        if program is None:
            return 0.0, Cost()
        verdict = self.verifier.judge(*self._run(program))
        return verdict.score, verdict.cost

    def cluster_key(self, reply: str) -> tuple[str | None, Cost]:
        """(the key of the reply's cluster, cost); None when it joins none (see the module docstring)."""
        program = self.program(reply)
        if program is None:
            return None, Cost()
        if self.verifier is None:
            try:
                return _digest(ast.unparse(ast.parse(program))), Cost()
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return None, Cost()
        report, run = self._run(program)
        cost = Cost(wall_seconds=run.wall_seconds, sandbox_seconds=run.cpu_seconds)
        if report.problem is not None or report.program is None or report.program["error"] is not None:
            return None, cost
        outcomes = []
        for index, (number,) in enumerate(self.verifier.checks_of):  # one check per example
            if index in report.errors:
                last = report.errors[index].strip().splitlines()[-1] if report.errors[index].strip() else ""
                outcomes.append(f"raised {last.split(':')[0]}")
            elif number in report.values:
                outcomes.append(f"= {canonical(report.values[number])}")
            else:
                outcomes.append(f"no value ({run.status})")
        return _digest("\n".join(outcomes)), cost

    def _run(self, program: str):
        """(report, run) of `program` on the examples (`run_cache.cached_run`)."""
        return cached_run(self.verifier, program)


class ExampleScorer(Scorer):
    """`ExampleTests.score` as a `Scorer`; ValueError for a problem without examples (it has no
    score: the caller falls back instead, see best_of_n_value)."""

    name = "tests"

    def __init__(self, tests: ExampleTests) -> None:
        self.tests = tests

    def score(self, prompt, candidates) -> Scores:
        if self.tests.verifier is None:
            raise ValueError("the prompt's docstrings hold no examples, so its answers have no tests score")
        values, cost = [], Cost()
        for candidate in candidates:
            value, spent = self.tests.score(candidate.text)
            values.append(value)
            cost += spent
        return Scores(values, cost)


def canonical(value) -> str:
    """A text for a plain value (as `code_report.decode` rebuilds it) equal for equal values of
    one type: sets and dict items sorted by their own canonical text. O(size · log size)."""
    if isinstance(value, (set, frozenset)):
        inner = sorted(canonical(item) for item in value)
        return f"{type(value).__name__}({{{', '.join(inner)}}})"
    if isinstance(value, dict):
        inner = sorted(f"{canonical(k)}: {canonical(v)}" for k, v in value.items())
        return "{" + ", ".join(inner) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(canonical(item) for item in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(canonical(item) + ", " for item in value) + ")"
    return repr(value)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
