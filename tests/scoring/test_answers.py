"""Answer patterns run in linear time (RE2) and math comparisons under a deadline in a worker
process: no answer and no pattern can hold the interpreter."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from metagen.scoring.answers import answers_match, extract_answer
from metagen.strategies.self_consistency import SelfConsistencyConfig
from metagen.strategies.spec import StrategyOptions

CHILD_SECONDS = 120  # a child interpreter that imports metagen (torch) on a loaded machine; a regression hangs for hours


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_backtracking_pattern_on_a_long_output_answers_at_once():
    """(a+)+$ against 60 a's and a "!" backtracks 2^60 times in Python's re, holding the GIL: in
    a child interpreter so that the regression fails (TimeoutExpired) instead of hanging."""
    program = ("from metagen.scoring.answers import extract_answer\n"
               "print(extract_answer('a' * 60 + '!', r'(a+)+$'), extract_answer('a' * 100_000, r'(a+)+$'))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "a" * 100_000]


@pytest.mark.parametrize(("pattern", "feature"), [
    (r"(a)\1", "backreferences"), (r"(?P<x>a)(?P=x)", "backreferences"),
    (r"(?=a)a", "lookaround"), (r"(?!a)b", "lookaround"), (r"(?<=is )(\d+)", "lookaround"), (r"(?<!x)y", "lookaround"),
])
def test_patterns_that_need_backtracking_are_refused_naming_the_field(pattern, feature):
    for build in (lambda: StrategyOptions(pattern=pattern), lambda: SelfConsistencyConfig(pattern=pattern),
                  lambda: extract_answer("the answer is 4", pattern)):
        with pytest.raises(ValueError, match=rf"pattern=.* is refused .*RE2.*no {feature}"):
            build()


def test_an_invalid_pattern_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"pattern='\(a' is not a valid regular expression \(missing \).*RE2 syntax"):
        StrategyOptions(pattern="(a")


def test_patterns_keep_their_meaning_on_re2():
    assert extract_answer("x = 2, so \\boxed{\\frac{3}{4}} and 7") == "\\frac{3}{4}"
    assert extract_answer("The answer is π.") == "π"  # the defaults' letters are Unicode (\pL)
    assert extract_answer("The answer is -1,234.5 and not 7,") == "-1234.5"
    assert extract_answer("A: yes. A: no", pattern=r"A: (?P<word>\w+)") == "no"  # named groups, the last match
    assert extract_answer("ANSWER=42", pattern=r"(?i)answer=\d+") == "ANSWER=42"  # no group: the whole match
    assert extract_answer("é 12 ü", pattern=r"(\d+) ü") == "12"  # offsets in characters, not UTF-8 bytes


@pytest.fixture
def worker():
    """The shared math worker, stopped after the test: no process is left behind."""
    pytest.importorskip("math_verify")
    from metagen.scoring.math_equal import WORKER

    yield WORKER
    pid = WORKER.pid
    WORKER.stop()
    assert pid is None or _gone_within(pid, 10)


def test_a_comparison_past_its_deadline_is_no_match_and_never_holds_the_interpreter(worker):
    """9^{9^{8}} = 3 makes sympy compute a 7-million-digit power, one C call that no signal
    interrupts (66 s in-process, holding the GIL): here it is False at the deadline, the worker
    is replaced, and a thread that ticks meanwhile is never held up for long (10 s: generous
    for a loaded machine, against a minute)."""
    from metagen.scoring import math_equal

    assert math_equal.MATH_TIMEOUT_SECONDS == 5.0
    assert answers_match("1/2", "0.5", math=True)  # the worker runs
    first = worker.pid
    ticks, stop = [time.monotonic()], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        assert math_equal.math_equal("9^{9^{8}}", "3", timeout=1.0) is False
    finally:
        stop.set()
        ticker.join()
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 10
    assert _gone_within(first, 10)  # killed at the deadline
    assert answers_match("\\frac{1}{2}", "0.5", math=True) and worker.pid != first  # a new worker
    assert not answers_match("0.25", "1/3", math=True)


def test_answers_match_bounds_a_comparison_on_a_worker_thread(worker):
    """Strategies compare on worker threads, where math-verify's alarm cannot be set: the
    deadline holds there too (MATH_TIMEOUT_SECONDS = 5; 60 s is a bound for a loaded machine,
    against minutes in-process)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        slow = pool.submit(answers_match, "9^{9^{9}}", "3", True)
        quick = pool.submit(answers_match, "2/4", "0.5", True)  # waits for the worker, then answers
        assert slow.result(timeout=60) is False and quick.result(timeout=60) is True
    assert time.monotonic() - started < 60


def test_the_worker_dies_with_its_parent_even_while_computing():
    """A parent killed by SIGKILL (no atexit) while its worker computes 9^{9^{9}}: the worker
    goes too (PR_SET_PDEATHSIG), instead of computing on for minutes."""
    pytest.importorskip("math_verify")
    program = ("import os, sys, threading, time\n"
               "from metagen.scoring.math_equal import WORKER\n"
               "assert WORKER.equal('1/2', '0.5')\n"
               "threading.Thread(target=WORKER.equal, args=('9^{9^{9}}', '3', 600.0), daemon=True).start()\n"
               "time.sleep(0.5)\n"
               "print(WORKER.pid, flush=True)\n"
               "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), line
        pid = int(line)
        assert _alive(pid)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    assert _gone_within(pid, 20)


def test_the_exact_answer_verifier_refuses_a_backtracking_pattern_when_built():
    from metagen.scoring.exact_answer import ExactAnswerVerifier

    with pytest.raises(ValueError, match=r"pattern='\(\?<=is \)\\\\d' is refused .*no lookaround"):
        ExactAnswerVerifier("4", pattern=r"(?<=is )\d")


def test_a_worker_killed_from_outside_is_replaced(worker):
    from metagen.scoring.math_equal import math_equal

    assert math_equal("1/2", "0.5")
    killed = worker.pid
    os.kill(killed, signal.SIGKILL)
    assert _gone_within(killed, 10)
    assert math_equal("2/4", "0.5") and worker.pid not in (None, killed)
