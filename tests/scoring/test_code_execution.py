"""CodeExecutionVerifier: program extraction, per-test verdicts and feedback, programs that
loop, exit, crash or do not compile, and programs that try to forge their verdict."""

import pytest

from metagen.decoding import Cost
from metagen.scoring.code_execution import CodeExecutionVerifier, extract_program
from metagen.decoding.result import Completion

TESTS = ["assert square(2) == 4", "assert square(-3) == 9", "assert square(0.5) == 0.25"]


def verify(text, tests=TESTS, **options):
    return CodeExecutionVerifier(tests, timeout=1.0, **options).verify("Write square(x).", Completion(text))


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
    assert verdict.cost.sandbox_seconds > 0  # the interpreter's CPU time, at least
    assert verdict.cost == Cost(wall_seconds=verdict.cost.wall_seconds, sandbox_seconds=verdict.cost.sandbox_seconds)


def test_wrong_program_fails_naming_the_failing_assertions():
    verdict = verify("def square(x):\n    print('debug', x)\n    return x + x\n")
    assert not verdict.passed and verdict.score == pytest.approx(1 / 3)  # 2 + 2 == 4 passes
    assert verdict.feedback.startswith("1 of 3 tests passed.")
    assert "FAILED assert square(-3) == 9" in verdict.feedback
    assert "FAILED assert square(0.5) == 0.25" in verdict.feedback
    assert "line 1: square(-3) returned -6" in verdict.feedback and "square(0.5) returned 1.0" in verdict.feedback
    assert "square(2)" not in verdict.feedback


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
    verdict = CodeExecutionVerifier(TESTS[:1], timeout=0.5).verify("q", Completion(program))
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
    scores = verifier("q", [Completion("def square(x): return x*x"), Completion("def square(x): return 0")])
    assert scores.values == [1.0, 0.0] and scores.cost.model_calls == 0
    with pytest.raises(ValueError, match="tests=\\[\\]"):
        CodeExecutionVerifier([])
    with pytest.raises(ValueError, match="timeout=0"):
        CodeExecutionVerifier("assert True", timeout=0)


# Programs that try to forge their verdict. Each is wrong (square returns 0 or x + x), so no
# test may pass, whatever the program does to the harness, its records or its process.

def verdicts(program, tests=TESTS, isolations=("auto", "audit")):
    return [CodeExecutionVerifier(tests, timeout=1.0, isolation=isolation).verify("q", Completion(program))
            for isolation in isolations]


WRITE_EVERYWHERE = "def write_everywhere(data):\n    for fd in range(1, 64):\n        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"


def test_a_program_that_walks_into_the_harness_and_forges_records_fails(no_leftovers):
    # The harness's frames hold its payload (once, a nonce that authenticated records): read it,
    # write records saying every test passed, to fd 1 and to every other descriptor, then exit
    # before the real tests run.
    forger = (
        "import json, os, sys\n" + WRITE_EVERYWHERE +
        "def square(x):\n    return 0\n"
        "frame, nonce, count = sys._getframe(), '', 3\n"
        "while frame is not None:\n"
        "    payload = frame.f_locals.get('payload')\n"
        "    if isinstance(payload, dict):\n"
        "        nonce, count = payload.get('nonce', ''), len(payload.get('tests', ()))\n"
        "    frame = frame.f_back\n"
        "records = [{'stage': 'program', 'error': None, 'compiles': True}]\n"
        "records += [{'test': i, 'error': None} for i in range(count)]\n"
        "records += [{'check': i, 'passed': True} for i in range(count)]\n"
        "data = ''.join(nonce + json.dumps(r) + '\\n' for r in records).encode()\n"
        "os.write(1, data)\n"
        "os.write(2, data)\n"
        "DESCRIPTORS\n"
        "os._exit(0)\n"
    )
    for everywhere in (False, True):
        program = forger.replace("DESCRIPTORS", "write_everywhere(data)" if everywhere else "pass")
        for verdict in verdicts(program):
            assert (verdict.passed, verdict.score) == (False, 0.0), verdict.feedback
            assert verdict.feedback.startswith("0 of 3 tests passed.")


def test_records_in_the_harness_format_only_claim_values_the_program_must_know(no_leftovers):
    # the harness's own emit, found on the stack, reports a guessed 4 for every check: only the
    # check whose hidden expected value is 4 passes
    program = (
        "import os, sys\ndef square(x):\n    return 0\n"
        "frame = sys._getframe()\n"
        "while frame is not None and 'emit' not in frame.f_locals:\n    frame = frame.f_back\n"
        "for check in range(3):\n    frame.f_locals['emit']({'check': check, 'value': 4})\n"
        "os._exit(0)\n"
    )
    for verdict in verdicts(program):
        assert not verdict.passed and verdict.score == pytest.approx(1 / 3), verdict.feedback
        assert "square(-3) returned 4" in verdict.feedback


def test_a_malformed_record_is_a_failed_verdict_not_an_exception(no_leftovers):
    # even with a correct square: only the program can have written the broken line
    program = ("import os, sys\n" + WRITE_EVERYWHERE +
               "frame, nonce = sys._getframe(), ''\n"
               "while frame is not None:\n"
               "    nonce = (frame.f_locals.get('payload') or {}).get('nonce', nonce) if isinstance(frame.f_locals.get('payload'), dict) else nonce\n"
               "    frame = frame.f_back\n"
               "write_everywhere((nonce + '{\"test\": 0, broken\\n').encode())\n"
               "def square(x):\n    return x * x\n")
    for verdict in verdicts(program):
        assert (verdict.passed, verdict.score) == (False, 0.0)
        assert "cannot be trusted" in verdict.feedback and "is not JSON" in verdict.feedback


def test_a_record_the_harness_also_writes_makes_the_report_unusable(no_leftovers):
    # a value record in the harness's own format for check 0, then the harness reports check 0
    program = ("import os, json\n" + WRITE_EVERYWHERE +
               "write_everywhere((json.dumps({'check': 0, 'value': 4}) + '\\n').encode())\n"
               "def square(x):\n    return x * x\n")
    for verdict in verdicts(program):
        assert (verdict.passed, verdict.score) == (False, 0.0)
        assert "repeats a check" in verdict.feedback


def test_exiting_early_fails_every_test_not_yet_reported(no_leftovers):
    program = "import os\ndef square(x):\n    if x < 0:\n        os._exit(0)\n    return x * x\n"
    for verdict in verdicts(program):
        assert not verdict.passed and verdict.score == pytest.approx(1 / 3)
        assert "NOT RUN assert square(-3) == 9" in verdict.feedback and "NOT RUN assert square(0.5)" in verdict.feedback
        assert "exited with code 0" in verdict.feedback


def test_killing_the_parent_or_the_session_fails_cleanly(no_leftovers):
    program = (
        "import os, signal\n"
        "for attempt in (lambda: os.kill(os.getppid(), signal.SIGKILL), lambda: os.killpg(0, signal.SIGKILL),\n"
        "                lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)):\n"
        "    try:\n        attempt()\n    except (OSError, AttributeError):\n        pass\n"
        "def square(x):\n    return 0\n"
    )
    for verdict in verdicts(program):
        assert (verdict.passed, verdict.score) == (False, 0.0)
        assert verdict.feedback.startswith("0 of 3 tests passed.")


def test_closing_and_replacing_descriptors_cannot_make_a_pass(no_leftovers):
    closer = "import os\nfor fd in range(64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\ndef square(x):\n    return x * x\n"
    for verdict in verdicts(closer):  # a right answer that cannot be reported is not a pass
        assert (verdict.passed, verdict.score) == (False, 0.0) and "NOT RUN" in verdict.feedback
    replacer = ("import os\nr, w = os.pipe()\nfor fd in range(1, 64):\n    if fd not in (r, w):\n        try:\n"
                "            os.dup2(w, fd)\n        except OSError:\n            pass\ndef square(x):\n    return x + x\n")
    for verdict in verdicts(replacer):
        assert not verdict.passed and verdict.score < 1.0


def test_an_object_that_equals_everything_does_not_pass(no_leftovers):
    always = "class Always:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n\ndef square(x):\n    return Always()\n"
    for verdict in verdicts(always):
        assert (verdict.passed, verdict.score) == (False, 0.0)
        assert "a value of type Always cannot be reported" in verdict.feedback
    subclass = "class Zero(int):\n    def __eq__(self, other):\n        return True\n\ndef square(x):\n    return Zero(0)\n"
    verdict, = verdicts(subclass, isolations=("auto",))  # compared as the int it is
    assert (verdict.passed, verdict.score) == (False, 0.0) and "square(-3) returned 0" in verdict.feedback


def test_huge_outputs_fail_with_feedback(no_leftovers):
    huge_value = "def square(x):\n    return 'x' * 10**7\n"
    verdict, = verdicts(huge_value, tests=TESTS[:1], isolations=("auto",))
    assert (verdict.passed, verdict.score) == (False, 0.0) and "too large to report" in verdict.feedback
    for target in ("1", "2", "fd"):
        flood = ("import os\n" + WRITE_EVERYWHERE + "chunk = b'{\"check\": 0' * 100000\nfor _ in range(100):\n"
                 + ("    write_everywhere(chunk)\n" if target == "fd" else f"    os.write({target}, chunk)\n")
                 + "def square(x):\n    return x * x\n")
        verdict, = verdicts(flood, tests=TESTS[:1], isolations=("auto",))
        assert (verdict.passed, verdict.score) == (False, 0.0), target
        assert "output_limit" in verdict.feedback or "cannot be trusted" in verdict.feedback


def test_values_are_compared_outside_the_sandbox_with_python_semantics():
    setup = "import math"
    program = (
        "from collections import namedtuple, OrderedDict\nPair = namedtuple('Pair', 'a b')\n"
        "def pair():\n    return Pair(1, 2)\n"
        "def listed():\n    return [1, 2]\n"
        "def table():\n    return OrderedDict(b=2, a=[1.5, None])\n"
        "def nothing():\n    return None\n"
        "def mixed():\n    return {(1,), b'\\x00', 2j, float('inf')}\n"
        "def third():\n    return 1 / 3\n"
        "def frozen():\n    return frozenset({1})\n"
        "def is_even(n):\n    return n % 2 == 0\n"
    )
    passing = [
        "assert pair() == (1, 2)", "assert (1, 2) == pair()", "assert listed() == [1, 2]", "assert listed() != (1, 2)",
        "assert table() == {'a': [1.5, None], 'b': 2}", "assert nothing() is None", "assert 2 in listed()",
        "assert listed() in ([1, 2], [3])", "assert pair() < (1, 3)", "assert math.isclose(third(), 0.3333, rel_tol=1e-3)",
        "assert mixed() == {(1,), b'\\x00', 2j, 1e999}", "assert is_even(4)", "assert not is_even(3)",
        "assert frozen() == {1}",        "x = listed()\nassert x[0] == 1\nassert x[-1] == 2", "assert not pair() == (2, 1)",
    ]
    failing = ["assert listed() == (1, 2)", "assert pair() == [1, 2]", "assert is_even(3)", "assert listed() < 'a'",
               "assert math.isclose(table(), 1.0)", "assert nothing() is not None"]
    verdict = CodeExecutionVerifier(passing + failing, timeout=2.0, setup=setup).verify("q", Completion(program))
    assert verdict.score == pytest.approx(len(passing) / (len(passing) + len(failing))), verdict.feedback
    assert verdict.feedback.count("FAILED") == len(failing)
    assert "listed() < 'a'" in verdict.feedback and "cannot be compared: TypeError" in verdict.feedback
    assert "line 1: listed() returned [1, 2]" in verdict.feedback


@pytest.mark.parametrize("test, message", [
    ("assert square(2) == square(-2)", "tests\\[0\\] line 1: `assert square\\(2\\) == square\\(-2\\)` cannot be checked"),
    ("for x in range(3):\n    assert square(x) == x * x", "tests\\[0\\] line 1: an assert inside a block"),
    ("assert isinstance(square(2), int)", "cannot be checked outside the sandbox"),
    ("assert square(1) == 1 and square(2) == 4", "cannot be checked outside the sandbox"),
    ("assert helper(2)", "`assert helper\\(2\\)` cannot be checked"),
    ("y = square(2)\nassert y", "tests\\[0\\] line 2"),
    ("assert (square(2) == 4) == True", "must be the program's answer, not a comparison"),
    ("assert square(2) is 4", "cannot be checked"),
    ("print(square(2))", "has no assert"),
    ("assert square(2) ==", "tests\\[0\\] does not compile"),
])
def test_tests_the_sandbox_could_fake_are_refused(test, message):
    with pytest.raises(ValueError, match=message):
        CodeExecutionVerifier(test, setup="def helper(x):\n    return x")


def test_a_long_fence_line_without_a_newline_is_read_in_linear_time():
    """A model's answer opening a fence and then writing 300,000 characters on one line: the tag and
    the rest of the line competed for the same characters (O(L^2): 32,000 took 1.5 s, this size
    minutes, on a verifier's worker thread). The bound is generous (linear time takes milliseconds)."""
    import time

    started = time.perf_counter()
    text = "```" + "a" * 300_000
    assert extract_program(text) == text  # no fence line ends: the whole answer is the program
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize("text, program", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("```py title=a.py\nx = 2\n```", "x = 2\n"),
    ("```c++\nint x;\n```\n```\ny = 3\n```", "y = 3\n"),
    ("  ```Python3 {.numberLines}\nz = 4\n  ```\n", "z = 4\n"),
])
def test_fence_tags_are_read_as_before(text, program):
    assert extract_program(text) == program
