"""Evaluation problems: JSONL files and the built-in arithmetic word problems.

A problem is a question with a reference answer. JSONL lines carry `question` (or `prompt`)
and `answer`, optionally `id` (default: the line number). The built-in task draws arithmetic
word problems from a seeded `random.Random`, so `arithmetic_problems(count, seed)` gives the
same problems on every machine and Python version (only `randrange`/`choice` are used).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file (UTF-8); ValueError naming the file, line and field when the
    file cannot be read or a line is malformed, FileNotFoundError when it does not exist."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for number, line in _lines(Path(path)):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        question = record.get("question", record.get("prompt"))
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{path}:{number}: field 'question' (or 'prompt') is missing or empty")
        if "answer" not in record or record["answer"] is None or str(record["answer"]).strip() == "":
            raise ValueError(f"{path}:{number}: field 'answer' is missing or empty")
        problem_id = str(record.get("id", number))
        if problem_id in seen:
            raise ValueError(f"{path}:{number}: id {problem_id!r} appears twice")
        seen.add(problem_id)
        problems.append(Problem(problem_id, question, str(record["answer"])))
    if not problems:
        raise ValueError(f"{path}: no problems found")
    return problems


def _lines(path: Path):
    """(line number, text) of a UTF-8 file; errors name the file (and line)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSONL file")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror})") from None
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {line[error.start]:#04x} at column "
                             f"{error.start + 1}); save the file as UTF-8") from None


_NAMES = ("Ava", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kemi", "Liam")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "books", "shells")


def _one_problem(rng: random.Random, top: int) -> tuple[str, int]:
    """One problem with operands in [2, top] (its answer is a non-negative integer)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)

    def number() -> int:
        return rng.randrange(2, top + 1)

    kind = rng.randrange(8)
    if kind == 0:
        a, b = number(), number()
        return f"{name} has {a} {item}. {name} finds {b} more. How many {item} does {name} have now?", a + b
    if kind == 1:
        b, left = number(), number()
        return f"{name} had {b + left} {item} and gave {b} of them to a friend. How many {item} are left?", left
    if kind == 2:
        a, b = number(), number()
        return f"A box holds {a} {item}. How many {item} are in {b} boxes?", a * b
    if kind == 3:
        each, count = number(), number()
        return (f"{each * count} {item} are shared equally among {count} children. "
                f"How many {item} does each child get?"), each
    if kind == 4:
        a, b = number(), number()
        c = rng.randrange(1, a * b)
        return (f"{name} buys {a} packs of {item} with {b} {item} in each pack, then loses {c} of them. "
                f"How many {item} does {name} have?"), a * b - c
    if kind == 5:
        a, b, c = number(), number(), number()
        return (f"{name} has {a} dollars and earns {b} dollars a day for {c} days. "
                f"How many dollars does {name} have then?"), a + b * c
    if kind == 6:
        a, b = number(), number()
        c = rng.randrange(1, a + b)
        return (f"A shelf has {a} {item}. {name} adds {b} more and then removes {c}. "
                f"How many {item} are on the shelf?"), a + b - c
    a, b, c = number(), number(), number()
    return (f"There are {a} bags with {b} {item} each and {c} more bags with {b} {item} each. "
            f"How many {item} are there in total?"), (a + c) * b


def arithmetic_problems(count: int = 100, seed: int = 0, max_number: int = 9) -> list[Problem]:
    """`count` one- and two-step arithmetic word problems (operands in [2, max_number]) with
    non-negative integer answers, from `seed`. Half the kinds take one operation (+, −, ×, ÷),
    half take two. Small operands keep the task within reach of small models."""
    if count < 1:
        raise ValueError(f"count={count} is out of range: must be >= 1")
    if max_number < 2:
        raise ValueError(f"max_number={max_number} is out of range: must be >= 2")
    rng = random.Random(seed)
    problems = []
    for index in range(count):
        question, answer = _one_problem(rng, max_number)
        problems.append(Problem(f"arithmetic-{seed}-{index}", question, str(answer)))
    return problems


def write_jsonl(problems: list[Problem], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps({"id": problem.id, "question": problem.question, "answer": problem.answer}) + "\n")
