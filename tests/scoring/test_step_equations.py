"""find_equations in time linear in the step, whatever the model wrote."""

import subprocess
import sys

from metagen.scoring.step_equations import find_equations

CHILD_SECONDS = 120  # a child interpreter importing metagen (torch) on a loaded machine; the regression takes hours


def test_a_long_sum_without_an_equals_sign_is_found_at_once():
    """"1 + 1 + ... + 1" with no "=": 2^terms steps on Python's re (12 terms took 23 s, 40 would
    take ages, holding the interpreter). In a child interpreter, so the regression fails
    (TimeoutExpired) instead of hanging."""
    program = ("from metagen.scoring.step_equations import find_equations\n"
               "print(find_equations('1' + ' + 1' * 40), find_equations('1' + ' + 1' * 200 + ' = 201'))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"[] [('{'1' + ' + 1' * 200}', '201', True)]"


def test_equations_read_as_before():
    assert find_equations("So 3 + 4 = 7, then 7 x 6 = 42 and 42 / 4 = 10.5 but 10 - 3 = 6.") == [
        ("3 + 4", "7", True), ("7 x 6", "42", True), ("42 / 4", "10.5", True), ("10 - 3", "6", False)]
    assert find_equations("1,000 × 2 = 2,000 and (1 + 2)x3 = 9") == [("1,000 × 2", "2,000", True),
                                                                    ("(1 + 2)x3", "9", True)]
