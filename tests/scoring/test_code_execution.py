"""CodeExecutionVerifier: program extraction, per-test verdicts and feedback, and programs that
loop, exit, crash or do not compile."""

import pytest

from metagen.decoding import Cost
from metagen.scoring.code_execution import CodeExecutionVerifier, extract_program
from metagen.strategies.result import Candidate

TESTS = ["assert square(2) == 4", "assert square(-3) == 9", "assert square(0.5) == 0.25"]


def verify(text, tests=TESTS, **options):
    return CodeExecutionVerifier(tests, timeout=1.0, **options).verify("Write square(x).", Candidate(text))


def test_extract_program_picks_the_last_python_block():
    answer = "First try:\n```python\ndef f(): return 1\n```\nBetter:\n```py\ndef f(): return 2\n```\nUsage:\n```\nf()\n```\n"
    assert extract_program(answer) == "def f(): return 2\n"
    assert extract_program("Run:\n```\nprint(1)\n```") == "print(1)\n"  # untagged block when no python one
    assert extract_program("def f():\n    return 3") == "def f():\n    return 3"  # no fences: the text
    assert extract_program("```python\ndef f():\n    return 4") == "def f():\n    return 4"  # cut off by max_tokens
    assert extract_program("```bash\nls\n```") is None
    assert extract_program("   \n") is None


def test_correct_program_passes_with_zero_model_calls():
    verdict = verify("Here it is:\n```python\ndef square(x):\n    return x * x\n```\nprint(square(3)) shows 9.")
    assert (verdict.passed, verdict.score, verdict.feedback) == (True, 1.0, "3 of 3 tests passed.")
    assert verdict.cost.model_calls == 0 and verdict.cost.wall_seconds > 0
    assert verdict.cost == Cost(wall_seconds=verdict.cost.wall_seconds)


def test_wrong_program_fails_naming_the_failing_assertions():
    verdict = verify("def square(x):\n    print('debug', x)\n    return x + x\n")
    assert not verdict.passed and verdict.score == pytest.approx(1 / 3)  # 2 + 2 == 4 passes
    assert verdict.feedback.startswith("1 of 3 tests passed.")
    assert "FAILED assert square(-3) == 9" in verdict.feedback
    assert "FAILED assert square(0.5) == 0.25" in verdict.feedback
    assert "AssertionError" in verdict.feedback and "square(2)" not in verdict.feedback


def test_errors_carry_the_traceback_of_the_program():
    verdict = verify("def square(x):\n    return x * undefined_name\n", tests=TESTS[:1])
    assert "File \"solution.py\", line 2, in square" in verdict.feedback
    assert "NameError: name 'undefined_name' is not defined" in verdict.feedback


def test_a_hanging_test_times_out_without_hiding_the_others():
    program = "def square(x):\n    while x < 0:\n        pass\n    return x * x\n"
    verdict = verify(program)
    assert not verdict.passed and verdict.score == pytest.approx(2 / 3)
    assert "FAILED assert square(-3) == 9" in verdict.feedback and "TimeoutError: took longer than 1 s" in verdict.feedback


def test_a_program_that_swallows_the_alarm_gets_the_sandbox_timeout():
    program = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"
    verdict = CodeExecutionVerifier(TESTS[:1], timeout=0.5).verify("q", Candidate(program))
    assert (verdict.passed, verdict.score) == (False, 0.0)
    assert "NOT RUN assert square(2) == 4" in verdict.feedback and "timeout" in verdict.feedback


def test_syntax_error_is_reported_and_no_test_runs():
    verdict = verify("```python\ndef square(x:\n    return x * x\n```")
    assert (verdict.passed, verdict.score) == (False, 0.0)
    assert "The program does not compile" in verdict.feedback and "SyntaxError" in verdict.feedback
    assert verdict.feedback.count("NOT RUN") == 3


def test_no_code_found():
    verdict = verify("I cannot solve this.\n```text\nsorry\n```")
    assert (verdict.passed, verdict.score, verdict.feedback) == (False, 0.0, "No Python code was found in the response.")
    assert verdict.cost.wall_seconds == 0


def test_exits_and_printing_do_not_fool_the_harness():
    fake = "import os, sys\nos.write(1, b'{\"test\": 0, \"error\": null}\\n')\nprint('{\"test\": 1, \"error\": null}')\n"
    faked = verify(fake + "sys.exit(0)\n")  # fake result lines, then SystemExit while loading
    assert faked.score == 0.0 and "SystemExit: 0" in faked.feedback
    killed = verify("import os\nos._exit(0)\n")
    assert killed.score == 0.0 and "did not finish loading" in killed.feedback
    exits_in_call = verify("import sys\ndef square(x):\n    sys.exit(0)\n", tests=TESTS[:1])
    assert not exits_in_call.passed and "SystemExit" in exits_in_call.feedback
    closes_stdout = verify("import sys, os\nos.close(1)\ndef square(x):\n    return x * x\n")
    assert closes_stdout.passed


def test_setup_runs_first_and_the_main_block_does_not():
    program = "def square(x):\n    return helper(x)\n\nif __name__ == '__main__':\n    raise SystemExit(input())\n"
    assert verify(program, setup="def helper(x):\n    return x * x").passed


def test_scorer_interface_and_validation():
    verifier = CodeExecutionVerifier("assert square(3) == 9", timeout=1.0)
    scores = verifier("q", [Candidate("def square(x): return x*x"), Candidate("def square(x): return 0")])
    assert scores.values == [1.0, 0.0] and scores.cost.model_calls == 0
    with pytest.raises(ValueError, match="tests=\\[\\]"):
        CodeExecutionVerifier([])
    with pytest.raises(ValueError, match="timeout=0"):
        CodeExecutionVerifier("assert True", timeout=0)
