"""`run_cache`: a program's sandbox run on its example tests is reused, from memory and from the
file `metagen eval --out` keeps (sandbox_runs.jsonl), only for the same harness, tests, limits
and program; the file survives a torn last line and names a malformed one."""

from __future__ import annotations

import json

import pytest

from metagen.eval import EvalConfig, Problem, evaluate
from metagen.sampling import SamplingParams
from metagen.scoring import run_cache
from metagen.scoring.code_execution import CodeExecutionVerifier
from metagen.scoring.example_tests import ExampleTests
from metagen.scoring.run_cache import cached_run, run_key, stored_runs
from metagen.strategies.registry import StrategyOptions
from tests.eval.test_code_problems import Replies

PROMPT = 'def double(x):\n    """Double x.\n    >>> double(2)\n    4\n    """\n'
RIGHT, WRONG = "    return 2 * x\n", "    return x + 1\n"


@pytest.fixture
def executions(monkeypatch):
    """Every real sandbox run of a verifier (the program run), with the memory layer emptied."""
    monkeypatch.setattr(run_cache, "_runs", type(run_cache._runs)())
    seen = []
    real = CodeExecutionVerifier.execute

    def counted(self, program):
        seen.append(program)
        return real(self, program)

    monkeypatch.setattr(CodeExecutionVerifier, "execute", counted)
    return seen


def test_the_same_program_runs_once_and_any_change_of_its_run_is_another_key(executions):
    tests = ExampleTests(PROMPT)
    program = tests.program(RIGHT)
    first = cached_run(tests.verifier, program)
    assert cached_run(tests.verifier, program) is first and len(executions) == 1
    other_limit = ExampleTests(PROMPT, timeout=2.0)
    assert run_key(other_limit.verifier, program) != run_key(tests.verifier, program)
    assert run_key(tests.verifier, tests.program(WRONG)) != run_key(tests.verifier, program)
    assert run_key(ExampleTests(PROMPT).verifier, program) == run_key(tests.verifier, program)


def test_runs_in_the_file_are_reused_by_a_new_process_with_their_measured_seconds(tmp_path, executions):
    path = tmp_path / "sandbox_runs.jsonl"
    tests = ExampleTests(PROMPT)
    with stored_runs(path):
        scored = [tests.score(RIGHT), tests.score(WRONG), tests.cluster_key(RIGHT)]
    assert len(executions) == 2 and len(path.read_text().splitlines()) == 2
    run_cache._runs.clear()  # a new process: nothing in memory
    with stored_runs(path):
        again = [tests.score(RIGHT), tests.score(WRONG), tests.cluster_key(RIGHT)]
    assert len(executions) == 2 and again == scored  # same scores, keys and seconds, from the file
    assert [value for value, _ in scored[:2]] == [1.0, 0.0]
    run_cache._runs.clear()
    tests.score(RIGHT)  # outside the block: the file is not read
    assert len(executions) == 3


def test_a_torn_last_line_is_dropped_and_a_malformed_line_is_named(tmp_path, executions):
    path = tmp_path / "runs.jsonl"
    tests = ExampleTests(PROMPT)
    with stored_runs(path):
        tests.score(RIGHT)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"key": "abc", "run": {"sta')
    with stored_runs(path) as store:
        assert len(store.runs) == 1
    assert path.read_bytes() == whole
    path.write_bytes(whole + b'{"key": "abc", "run": {"status": "ok"}}\n')
    with pytest.raises(ValueError, match=f"{path}:2: stored sandbox run lacks returncode, stdout, stderr, "
                                         "wall_seconds, isolation; the file is a cache of sandbox runs: delete it"):
        with stored_runs(path):
            pass
    path.write_bytes(b"not json\n")
    with pytest.raises(ValueError, match=f"{path}:1: not a stored sandbox run"):
        with stored_runs(path):
            pass


def test_a_rerun_of_eval_summarizes_code_pools_without_the_sandbox(tmp_path, executions):
    problem = Problem("double", PROMPT, "", "def check(candidate):\n    assert candidate(3) == 6\n", "double")
    replies = {"double": [(RIGHT, -0.5), (WRONG, -0.1), ("    return x * 2\n", -0.3), (WRONG, -0.2)]}
    config = EvalConfig(("best_of_n_value", "code_cluster"), ns=(1, 4), subsets=4,
                        params=SamplingParams(temperature=1.0), options=StrategyOptions(value="tests"))
    first = evaluate(Replies(replies), [problem], config, tmp_path)
    ran = len(executions)
    assert ran == 3  # three distinct programs, each run once on the example
    stored = [json.loads(line) for line in (tmp_path / "sandbox_runs.jsonl").read_text().splitlines()]
    assert len(stored) == 3 and all(record["run"]["status"] == "ok" for record in stored)
    run_cache._runs.clear()
    again = evaluate(Replies(replies), [problem], config, tmp_path)
    assert len(executions) == ran  # the summary read every run from --out
    assert [(p.strategy, p.n, p.accuracy, p.cost.sandbox_seconds) for p in again.points] == \
        [(p.strategy, p.n, p.accuracy, p.cost.sandbox_seconds) for p in first.points]
