"""Built-in task, JSONL loading and pass@k."""

import json
import math
import re
from itertools import combinations

import pytest

from metagen.eval import arithmetic_problems, load_jsonl, pass_at_k, write_jsonl
from metagen.eval.metrics import mean_and_stderr


def _solve(question: str) -> int:
    """An independent solver for the task's eight templates."""
    numbers = [int(x) for x in re.findall(r"\d+", question)]
    if "finds" in question:
        return numbers[0] + numbers[1]
    if "gave" in question:
        return numbers[0] - numbers[1]
    if "A box holds" in question:
        return numbers[0] * numbers[1]
    if "shared equally" in question:
        return numbers[0] // numbers[1]
    if "packs" in question:
        return numbers[0] * numbers[1] - numbers[2]
    if "dollars a day" in question:
        return numbers[0] + numbers[1] * numbers[2]
    if "shelf" in question:
        return numbers[0] + numbers[1] - numbers[2]
    return (numbers[0] + numbers[2]) * numbers[1]


def test_arithmetic_task_is_deterministic_and_correct():
    problems = arithmetic_problems(200, seed=7)
    assert problems == arithmetic_problems(200, seed=7)
    assert problems != arithmetic_problems(200, seed=8)
    assert len({p.id for p in problems}) == 200
    for problem in problems:
        assert int(problem.answer) == _solve(problem.question) >= 0
        assert max(int(x) for x in re.findall(r"\d+", problem.question)) <= 9 * 9
    assert arithmetic_problems(1, seed=0)[0].question == (
        "Grace has 6 books. Grace finds 9 more. How many books does Grace have now?"
    )
    with pytest.raises(ValueError, match="count=0"):
        arithmetic_problems(0)
    with pytest.raises(ValueError, match="max_number=1"):
        arithmetic_problems(3, max_number=1)


def test_jsonl_round_trip_and_errors(tmp_path):
    path = tmp_path / "task.jsonl"
    write_jsonl(arithmetic_problems(5), path)
    assert load_jsonl(path) == arithmetic_problems(5)
    path.write_text(json.dumps({"prompt": "2+2?", "answer": 4}) + "\n\n" + json.dumps({"question": "x", "answer": "y"}) + "\n")
    assert [(p.id, p.question, p.answer) for p in load_jsonl(path)] == [("1", "2+2?", "4"), ("3", "x", "y")]
    for line, message in (("{\"question\": \"q\"}", "field 'answer'"), ("{\"answer\": 1}", "field 'question'"),
                          ("[1]", "expected a JSON object"), ("{oops", "not valid JSON")):
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=f"task.jsonl:1: {message}"):
            load_jsonl(path)
    path.write_text('{"id": 1, "question": "a", "answer": 1}\n{"id": 1, "question": "b", "answer": 2}\n')
    with pytest.raises(ValueError, match="id '1' appears twice"):
        load_jsonl(path)


def test_jsonl_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} is a directory, not a JSONL file"):
        load_jsonl(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file"):
        load_jsonl(tmp_path / "missing.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"question": "x", "answer": 1}\n{"question": "Café?", "answer": 2}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9 at column 18\)"):
        load_jsonl(path)


def test_pass_at_k_matches_enumeration():
    for n, c in ((5, 0), (5, 2), (6, 6), (8, 3)):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(outcomes, k))
            exact = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    assert 0 < pass_at_k(1000, 3, 10) < 1 and math.isfinite(pass_at_k(1000, 3, 10))
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(5, 1, 0)
    with pytest.raises(ValueError, match="c=6"):
        pass_at_k(5, 6, 1)
    assert mean_and_stderr([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, math.sqrt(1 / 3 / 4)))
