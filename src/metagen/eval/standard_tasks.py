"""Built-in tasks as `Problem`s: GSM8K's test set and MBPP's test split, read from the files of
their canonical sources (fetched and checked by `downloads.py`), and the question-answering sets
of `qa_tasks.py` (`load_task`: a `Task`, its problems with the corpus and answer pattern its runs
default to).

  gsm8k  the 1,319 grade-school math problems of GSM8K's test set (Cobbe et al. 2021). The
         question is asked as it is; the reference answer is the number after the solution's
         "#### " line, thousands separators dropped ("#### 1,600" -> "1600"). A reply is graded
         as any question with an answer is (`judging.correct`): its answer extracted with the
         run's pattern (default: a \\boxed{} answer, else "answer is X", else the last number)
         and compared as math. Ids "gsm8k/<line index from 0>".
  mbpp   the 500 problems of MBPP's test split, task ids 11-510 (Austin et al. 2021). The
         prompt is the problem's text and its first test assertion, as a docstring:

             \"\"\"
             Write a python function to remove first and last occurrence of a given character from the string.
             assert remove_Occ("hello","l") == "heo"
             \"\"\"

         (the form of the MBPP paper's prompt with one example test, as EvalPlus writes it);
         the assertion fixes the function's name and signature. The hidden test is the
         problem's `test_setup_code` then every assertion of `test_list`, at module level, run in
         the sandbox after the reply's program (`code_grading`), as MBPP's own harness runs
         code, setup, then tests; its `check(candidate)` follows them, empty. The entry point
         is the first function the first assertion calls that the reference solution defines.
         `challenge_test_list` is not used (nor by the paper's results). Ids "mbpp/<task id>".

  math500  the 500 MATH test problems of "Let's Verify Step by Step" (Lightman et al. 2023;
         PRM800K's held-out split of MATH, Hendrycks et al. 2021), each asked with
         MATH_INSTRUCTION after it (the answer is LaTeX: a box says where it ends). The reference is
         the record's `answer` ("\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)",
         "\\text{Evelyn}"); a reply's answer is extracted as for GSM8K (a \\boxed{} answer first)
         and compared as math by math-verify, so "\\dfrac{14}{3}" and "14/3" are right. Ids
         "math500/<subject>/<number>" from the record's unique_id ("test/precalculus/807.json").

multihop, s2a_distractors and hotpotqa are short-answer question sets (`qa_tasks.py`): the first
two shipped with metagen, hotpotqa read from the user's copy (`--data`, required).

With a file given (`--data`), every record in it is read (GSM8K, MATH-500), or those of the test split
(MBPP): a subset of the file is a subset of the task. The cached MBPP file, whose checksum is
not pinned, is checked here instead: 974 records, all 500 test ids present.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from metagen.eval import qa_tasks
from metagen.eval.downloads import SOURCES, data_directory, data_file
from metagen.eval.tasks import Problem, humaneval_problems
from metagen.jsonl import json_records

GSM8K_SIZE = 1319
MATH500_SIZE = 500
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MBPP_TEST_IDS = range(11, 511)
MBPP_RECORDS = 974
# The assertions run at module level, where MBPP's harness runs them (a solution may itself be
# named `check`: MBPP/56, MBPP/349); the grader then calls check(), which passes them on.
MBPP_CHECK = "\n\ndef check(candidate):\n    pass  # the assertions above ran as this file loaded\n"


def gsm8k_problems(path: str | Path | None = None) -> list[Problem]:
    """GSM8K's test problems from `path`, or from the cached (or downloaded) canonical file; the
    whole published set has GSM8K_SIZE. ValueError naming the file and line of a malformed record."""
    file = data_file(SOURCES["gsm8k"], path)
    problems = []
    for number, record in json_records(file):
        question, solution = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{file}:{number}: field 'question' is missing or empty (a GSM8K record holds "
                             "'question' and 'answer')")
        if not isinstance(solution, str) or "####" not in solution:
            raise ValueError(f"{file}:{number}: field 'answer' is {solution!r:.60}: a GSM8K solution ends with "
                             "'#### <number>'")
        answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
        if not answer:
            raise ValueError(f"{file}:{number}: field 'answer' has nothing after '####'")
        problems.append(Problem(f"gsm8k/{number - 1}", question, answer))
    if not problems:
        raise ValueError(f"{file}: no problems found")
    return problems


def math500_problems(path: str | Path | None = None) -> list[Problem]:
    """MATH-500's problems from `path`, or from the cached (or downloaded) canonical file, each
    asked with MATH_INSTRUCTION; the published set has MATH500_SIZE. ValueError naming the file
    and line of a malformed record."""
    file = data_file(SOURCES["math500"], path)
    problems, seen = [], set()
    for number, record in json_records(file):
        for field in ("problem", "answer", "unique_id"):
            if not isinstance(record.get(field), str) or not record[field].strip():
                raise ValueError(f"{file}:{number}: field {field!r} is missing or empty (a MATH-500 record holds "
                                 "'problem', 'answer' and 'unique_id')")
        name = record["unique_id"].removeprefix("test/").removesuffix(".json")
        if name in seen:
            raise ValueError(f"{file}:{number}: unique_id {record['unique_id']!r} appears twice")
        seen.add(name)
        question = f"{record['problem'].strip()}\n\n{MATH_INSTRUCTION}"
        problems.append(Problem(f"math500/{name}", question, record["answer"].strip()))
    if not problems:
        raise ValueError(f"{file}: no problems found")
    return problems


def mbpp_problems(path: str | Path | None = None) -> list[Problem]:
    """MBPP's test-split problems (task ids 11-510) from `path`, or from the cached (or
    downloaded) canonical file, in task-id order. ValueError naming the file and line of a
    malformed record, or (the canonical file) the ids missing from it."""
    file = data_file(SOURCES["mbpp"], path)
    records = {}
    for number, record in json_records(file):
        task_id = record.get("task_id")
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise ValueError(f"{file}:{number}: field 'task_id' is {task_id!r:.40}: must be an integer")
        if task_id in records:
            raise ValueError(f"{file}:{number}: task_id {task_id} appears twice")
        records[task_id] = (number, record)
    if path is None:
        missing = [task_id for task_id in MBPP_TEST_IDS if task_id not in records]
        if len(records) != MBPP_RECORDS or missing:
            raise ValueError(f"{file} holds {len(records)} records (MBPP has {MBPP_RECORDS}) and misses "
                             f"{len(missing)} test-split ids: not the published file; delete it to fetch it again")
    problems = [_mbpp_problem(record, f"{file}:{number}") for task_id, (number, record) in sorted(records.items())
                if task_id in MBPP_TEST_IDS]
    if not problems:
        raise ValueError(f"{file}: no MBPP test-split problem (task ids {min(MBPP_TEST_IDS)}-"
                         f"{max(MBPP_TEST_IDS)}) in it")
    return problems


def _mbpp_problem(record: dict, where: str) -> Problem:
    """One MBPP record as a code problem (see the module docstring); ValueError naming `where`."""
    text, code, tests = record.get("text"), record.get("code"), record.get("test_list")
    setup = record.get("test_setup_code") or ""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: field 'text' is missing or empty")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise ValueError(f"{where}: field 'test_list' must be a non-empty list of assertions")
    if not isinstance(code, str) or not isinstance(setup, str):
        raise ValueError(f"{where}: fields 'code' and 'test_setup_code' must be text")
    entry_point = _called_function(tests[0], code, where)
    prompt = f'"""\n{text.strip()}\n{tests[0].strip()}\n"""\n'
    asserts = "".join(f"{test.strip()}\n" for test in tests)
    test = (setup.replace("\r\n", "\n").strip() + "\n\n" if setup.strip() else "") + asserts + MBPP_CHECK
    return Problem(f"mbpp/{record['task_id']}", prompt, "", test, entry_point)


def _called_function(assertion: str, code: str, where: str) -> str:
    """The first function `assertion` calls that `code` (the reference solution) defines at top level."""
    try:
        called = [node.func.id for node in ast.walk(ast.parse(assertion.strip()))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
        defined = {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}
    except SyntaxError as error:
        raise ValueError(f"{where}: field 'test_list' or 'code' does not parse ({error.msg})") from None
    for name in called:
        if name in defined:
            return name
    raise ValueError(f"{where}: the first assertion calls no function the solution ('code') defines: {assertion!r:.80}")


LOADED = ("humaneval", "gsm8k", "mbpp", "math500", "multihop", "s2a_distractors", "hotpotqa")  # `load_task` reads these
DOWNLOADED = ("gsm8k", "mbpp", "math500", "hotpotqa")  # those read from a data file (`--data PATH` gives it)


@dataclass(frozen=True)
class Task:
    """A built-in task's problems and what its runs default to: corpus, the file its retrieval
    strategies search unless --retriever names another (None: no corpus); pattern, how answers
    are read from replies unless --pattern is given (None: the default extraction); train, the
    labelled examples (question, answer JSONL, none of them evaluated) a strategy that learns
    from examples (dsp) reads unless --train names another (None: it runs zero-shot)."""

    problems: list[Problem]
    corpus: Path | None = None
    pattern: str | None = None
    train: Path | None = None


def load_task(name: str, data: str | Path | None = None) -> Task:
    """Built-in task `name` other than arithmetic (whose problems are drawn with their own
    options: `tasks.arithmetic_problems`); `data`: the file of a DOWNLOADED task (hotpotqa has
    no published copy here: its file is required). A HotpotQA file's corpus is written once into
    $METAGEN_DATA (`qa_tasks.corpus_file`)."""
    if name not in LOADED:
        raise ValueError(f"task {name!r} is not one load_task reads: give one of {', '.join(LOADED)}")
    if data is not None and name not in DOWNLOADED:
        raise ValueError(f"--data gives the file of a task read from one ({', '.join(DOWNLOADED)}), "
                         f"not of --task {name}")
    if name == "humaneval":
        return Task(humaneval_problems())
    if name in ("gsm8k", "mbpp", "math500"):
        return Task({"gsm8k": gsm8k_problems, "mbpp": mbpp_problems, "math500": math500_problems}[name](data))
    if name == "multihop":
        return Task(qa_tasks.multihop_problems(), qa_tasks.CORPUS, qa_tasks.QA_PATTERN, qa_tasks.MULTIHOP_DEMOS)
    if name == "s2a_distractors":
        return Task(qa_tasks.s2a_problems(), None, qa_tasks.QA_PATTERN)
    if data is None:
        raise ValueError("--task hotpotqa reads your copy of HotpotQA: give --data PATH (its JSON, e.g. "
                         "hotpot_dev_distractor_v1.json, or JSONL); no copy is shipped or downloaded")
    problems, passages = qa_tasks.hotpotqa(data)
    return Task(problems, qa_tasks.corpus_file(passages, data_directory(), data), qa_tasks.QA_PATTERN)
