"""GSM8K, MBPP and MATH-500 as `--task`s: the files fetched once into a checked cache (the downloader is
replaced: no test reaches the network), read from --data offline, a clear error without either;
GSM8K graded by its '#### N' number, MATH-500 by its LaTeX answer as math, MBPP by its assertions
in the sandbox; `--task a,b` runs and
reports each task on its own."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from metagen.cli import main
from metagen.eval import downloads
from metagen.eval.code_grading import grade
from metagen.eval.downloads import SOURCES, DataUnavailableError, data_file
from metagen.eval.judging import correct
from metagen.eval.standard_tasks import MATH_INSTRUCTION, gsm8k_problems, math500_problems, mbpp_problems
from metagen.scoring.answers import extract_answer
from metagen.scoring.doc_examples import doc_examples
from metagen.strategies.registry import StrategyOptions
from tests.eval import math500_sample, mbpp_sample
from tests.eval.test_eval_cli import loads  # noqa: F401  (the toy model behind `metagen eval`)

GSM8K_LINES = [
    {"question": "Ava has 3 apples and buys 4 more. How many apples does she have?",
     "answer": "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A farm sells 1,200 eggs a day for 2 dollars each. How much does it make?",
     "answer": "1,200 * 2 = <<1200*2=2400>>2400\n#### 2,400"},
]


def shared_data(name: str) -> Path:
    """The shared copy of data set `name` (shared/data/NAME beside the checkout, or under
    $METAGEN_SHARED_DATA): the folder's parents are searched, as CI lays shared/ beside its clone."""
    explicit = os.environ.get("METAGEN_SHARED_DATA")
    roots = [Path(explicit)] if explicit else [parent / "shared" / "data" for parent in Path(__file__).resolve().parents]
    for root in roots:
        if (root / name).is_dir():
            return root / name
    pytest.skip(f"no shared copy of {name} (shared/data/{name} beside the checkout, or $METAGEN_SHARED_DATA)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty $METAGEN_DATA, and a downloader that fails as with no network unless a test
    serves `files[url]`; `calls` lists the URLs asked for."""
    monkeypatch.setenv("METAGEN_DATA", str(tmp_path / "data"))
    files, calls = {}, []

    def download(url: str) -> bytes:
        calls.append(url)
        if url not in files:
            raise OSError("network unreachable")
        return files[url]

    monkeypatch.setattr(downloads, "download", download)
    return tmp_path / "data", files, calls


def _gsm8k_bytes() -> bytes:
    return "".join(json.dumps(line) + "\n" for line in GSM8K_LINES).encode()


# ----------------------------------------------------------------------------- download and cache


def test_the_first_use_downloads_and_checks_the_file_and_the_next_reads_the_cache(cache, monkeypatch):
    directory, files, calls = cache
    body = _gsm8k_bytes()
    monkeypatch.setitem(SOURCES, "gsm8k", SOURCES["gsm8k"].__class__(
        "gsm8k", "https://example.test/gsm8k.jsonl", "gsm8k-test.jsonl", hashlib.sha256(body).hexdigest(), "MIT"))
    files["https://example.test/gsm8k.jsonl"] = body
    problems = gsm8k_problems()
    assert [(p.id, p.answer) for p in problems] == [("gsm8k/0", "7"), ("gsm8k/1", "2400")]
    assert (directory / "gsm8k-test.jsonl").read_bytes() == body
    assert list(directory.iterdir()) == [directory / "gsm8k-test.jsonl"]  # no staging file left behind
    assert gsm8k_problems() == problems and len(calls) == 1  # read from the cache


def test_a_download_with_another_checksum_is_refused_and_not_kept(cache):
    directory, files, _ = cache
    files[SOURCES["gsm8k"].url] = _gsm8k_bytes()  # not the published file
    with pytest.raises(ValueError, match="has SHA-256 .* not the published gsm8k file's 3730d312"):
        gsm8k_problems()
    assert not directory.exists() or list(directory.iterdir()) == []


def test_a_corrupt_cached_file_is_fetched_again(cache):
    directory, files, calls = cache
    directory.mkdir(parents=True)
    (directory / "gsm8k-test.jsonl").write_text("truncated")
    with pytest.raises(DataUnavailableError):  # the bad copy is not used; the download fails here
        data_file(SOURCES["gsm8k"])
    assert calls == [SOURCES["gsm8k"].url]


def test_offline_without_a_file_the_error_says_where_to_put_it(cache):
    directory, _, _ = cache
    with pytest.raises(DataUnavailableError) as error:
        gsm8k_problems()
    message = str(error.value)
    for part in (str(directory / "gsm8k-test.jsonl"), SOURCES["gsm8k"].url, "--data PATH", "METAGEN_DATA",
                 "network unreachable"):
        assert part in message


def test_data_directory_defaults_under_the_metagen_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("METAGEN_DATA", raising=False)
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path))
    assert downloads.data_directory() == tmp_path / "data"


# ----------------------------------------------------------------------------- GSM8K


def test_the_shared_gsm8k_copy_is_the_published_file_and_grades_by_its_number(cache):
    path = shared_data("gsm8k") / "test.jsonl"
    assert downloads.sha256_of(path) == SOURCES["gsm8k"].sha256
    problems = gsm8k_problems(path)
    assert len(problems) == 1319 and problems[0].id == "gsm8k/0" and problems[0].answer == "18"
    options = StrategyOptions()
    assert correct("18", problems[0], options) and not correct("9", problems[0], options)
    assert not any("," in p.answer or not p.answer for p in problems)  # "#### 2,125" -> "2125"
    assert cache[2] == []  # --data: nothing downloaded


def test_gsm8k_data_other_than_the_published_file_is_read_with_a_warning(tmp_path, capsys, cache):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(_gsm8k_bytes())
    assert [p.answer for p in gsm8k_problems(path)] == ["7", "2400"]
    assert "is not the published gsm8k file" in capsys.readouterr().err


def test_a_gsm8k_record_without_its_number_is_named(tmp_path, cache):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GSM8K_LINES[0]) + "\n" + json.dumps({"question": "q", "answer": "no mark"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'answer' .* '#### <number>'"):
        gsm8k_problems(path)


# ----------------------------------------------------------------------------- MATH-500


@pytest.fixture
def math500_file(tmp_path) -> Path:
    path = tmp_path / "math500.jsonl"
    math500_sample.write(path)
    return path


def test_math500_source_is_pinned_to_a_commit_and_its_lfs_object():
    source = SOURCES["math500"]
    assert "/openai/prm800k/7ecc794703b2877f63226f2477a49b34f9b25163/prm800k/math_splits/test.jsonl" in source.url
    assert len(source.sha256) == 64 and source.filename == "math500-test.jsonl"


def test_math500_asks_each_problem_with_the_box_instruction_and_keeps_its_latex_answer(math500_file, cache):
    problems = math500_problems(math500_file)
    records = [json.loads(line) for line in math500_sample.LINES]
    assert [p.id for p in problems][:2] == ["math500/precalculus/807", "math500/algebra/2584"]
    assert all(p.question == f"{r['problem']}\n\n{MATH_INSTRUCTION}" for p, r in zip(problems, records))
    assert [p.answer for p in problems] == [r["answer"] for r in records]
    assert cache[2] == []  # --data: nothing downloaded


def test_each_math500_reference_solution_grades_right_and_its_neighbours_answer_wrong(math500_file, cache):
    pytest.importorskip("math_verify")
    problems, options = math500_problems(math500_file), StrategyOptions()
    records = [json.loads(line) for line in math500_sample.LINES]
    for i, (problem, record) in enumerate(zip(problems, records)):
        # the solution ends in \boxed{...}, nested up to 2 deep ("\frac{3\sqrt{3}}{4}")
        assert correct(extract_answer(record["solution"]), problem, options), record["answer"]
        assert not correct(records[i - 1]["answer"], problem, options), (records[i - 1]["answer"], record["answer"])


@pytest.mark.parametrize(("reply", "reference", "right"), [
    ("\\dfrac{14}{3}", "\\frac{14}{3}", True),
    ("14/3", "\\frac{14}{3}", True),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("3", "\\left( 3, \\frac{\\pi}{2} \\right)", False),  # a tuple is not its first element
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt 3}{2}", True),
    ("90", "90^\\circ", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("\\text{(C)}", "\\text{(E)}", False),
])
def test_latex_answers_compare_as_math_with_their_delimiters(reply, reference, right):
    pytest.importorskip("math_verify")
    from metagen.scoring.answers import answers_match

    assert answers_match(reply, reference, math=True) is right


def test_a_math500_record_without_its_answer_or_with_a_repeated_id_is_named(tmp_path, cache):
    good = json.loads(math500_sample.LINES[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "answer": ""}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'answer' is missing or empty"):
        math500_problems(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: unique_id 'test/precalculus/807.json' appears twice"):
        math500_problems(path)


def test_eval_task_math500_runs_from_a_given_copy(tmp_path, capsys, loads, math500_file, cache):  # noqa: F811
    argv = [*BASE, "--task", "math500", "--data", str(math500_file), "--limit", "2", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["results"]
    assert [(row["task"], row["problems"]) for row in rows] == [("math500", 2)]
    assert "is not the published math500 file" in captured.err  # eight records, not the 500
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert {record["id"] for record in records if record["kind"] == "live"} == {
        "math500/precalculus/807", "math500/algebra/2584"}


# ----------------------------------------------------------------------------- MBPP


@pytest.fixture
def mbpp_file(tmp_path) -> Path:
    path = tmp_path / "mbpp.jsonl"
    mbpp_sample.write(path)
    return path


def test_mbpp_reads_the_test_split_with_the_first_assertion_as_the_example(mbpp_file, cache):
    problems = mbpp_problems(mbpp_file)
    assert [p.id for p in problems] == ["mbpp/11", "mbpp/17", "mbpp/20"]  # id 2 is not in the test split
    first = problems[0]
    assert first.question == ('"""\nWrite a python function to remove first and last occurrence of a given character '
                              'from the string.\nassert remove_Occ("hello","l") == "heo"\n"""\n')
    assert first.entry_point == "remove_Occ" and first.is_code
    assert first.test.count("assert ") == 3 and "hellolloll" not in first.test  # no challenge tests
    shown = doc_examples(first.question).examples  # what example-reading strategies see: the first assertion
    assert [(e.expression, e.expected) for e in shown] == [("remove_Occ('hello', 'l')", "heo")]


def test_mbpp_grades_the_reference_solution_right_and_a_wrong_one_by_the_failing_assertion(mbpp_file, cache):
    problem = mbpp_problems(mbpp_file)[1]  # square_perimeter
    assert grade(problem, "```python\ndef square_perimeter(a):\n    return 4 * a\n```").passed
    completion = grade(problem, "def square_perimeter(a):\n    return 4 * a\n")  # continuing the docstring
    assert completion.passed
    wrong = grade(problem, "```python\ndef square_perimeter(a):\n    return 40 if a == 10 else 0\n```")
    assert not wrong.passed and wrong.reason == "AssertionError at test.py line 2: assert square_perimeter(5)==20"


def test_an_mbpp_solution_named_check_is_graded_on_its_own_assertions(tmp_path, cache):
    record = {"text": "Write a function to check whether n is even.", "task_id": 56, "test_setup_code": "",
              "code": "def check(n):\r\n  return n % 2 == 0", "challenge_test_list": [],
              "test_list": ["assert check(4) == True", "assert check(3) == False"]}
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    problem = mbpp_problems(path)[0]
    assert problem.entry_point == "check"
    assert grade(problem, "```python\ndef check(n):\n    return n % 2 == 0\n```").passed
    assert not grade(problem, "```python\ndef check(n):\n    return True\n```").passed


def test_the_cached_mbpp_file_must_hold_the_whole_test_split(cache, mbpp_file):
    directory, files, _ = cache
    files[SOURCES["mbpp"].url] = mbpp_file.read_bytes()  # four records: not the published file
    with pytest.raises(ValueError, match="holds 4 records .MBPP has 974. and misses 497 test-split ids"):
        mbpp_problems()


# ----------------------------------------------------------------------------- the CLI

BASE = ["eval", "--strategy", "greedy", "--n", "1", "--max-tokens", "3", "--json"]


def test_eval_runs_a_comma_list_of_tasks_each_into_its_own_directory(tmp_path, capsys, loads, mbpp_file, cache,  # noqa: F811
                                                                      monkeypatch):
    directory, files, _ = cache
    files[SOURCES["mbpp"].url] = mbpp_file.read_bytes()
    monkeypatch.setattr("metagen.eval.standard_tasks.MBPP_RECORDS", 4)
    monkeypatch.setattr("metagen.eval.standard_tasks.MBPP_TEST_IDS", range(11, 21))
    with pytest.raises(ValueError):  # ids 12-16 and 18-19 are missing: the guard holds
        mbpp_problems()
    monkeypatch.setattr("metagen.eval.standard_tasks.MBPP_TEST_IDS", [11, 17, 20])
    argv = [*BASE, "--task", "arithmetic,mbpp", "--count", "2", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(row["task"], row["problems"]) for row in data["results"]} == {("arithmetic", 2), ("mbpp", 3)}
    assert set(data["tasks"]) == {"arithmetic", "mbpp"} and "frontier" in data["tasks"]["mbpp"]
    for task in ("arithmetic", "mbpp"):
        records = [json.loads(line) for line in (tmp_path / "out" / task / "results.jsonl").read_text().splitlines()]
        ids = {record["id"] for record in records if record["kind"] != "setup"}
        assert ids and all(i.startswith(task) for i in ids)
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == data
    results = (tmp_path / "out" / "mbpp" / "results.jsonl").read_bytes()
    assert main(argv) == 0 and json.loads(capsys.readouterr().out) == data  # resumed: nothing new
    assert (tmp_path / "out" / "mbpp" / "results.jsonl").read_bytes() == results
    assert main([*argv[:argv.index("--json")], *argv[argv.index("--json") + 1:], "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.strip() == (tmp_path / "out" / "summary.md").read_text().strip()
    titles = [line for line in markdown.splitlines() if line.startswith("## task ")]
    assert titles == ["## task arithmetic (2 problems)", "## task mbpp (3 problems)"]
    assert markdown.count("| strategy | n | accuracy [95% interval] |") == 2
    assert (tmp_path / "out" / "mbpp" / "summary.md").read_text().startswith("| strategy | n |")


def test_eval_task_gsm8k_reads_a_given_copy_offline(tmp_path, capsys, loads, cache):  # noqa: F811
    path = shared_data("gsm8k") / "test.jsonl"
    argv = [*BASE, "--task", "gsm8k", "--data", str(path), "--limit", "2", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [(row["task"], row["problems"]) for row in rows] == [("gsm8k", 2)]
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert {record["id"] for record in records if record["kind"] == "live"} == {"gsm8k/0", "gsm8k/1"}
    assert cache[2] == []  # nothing downloaded


@pytest.mark.parametrize(("argv", "message"), [
    (["--task", "gsm8k,gsm9k"], "--task 'gsm9k' is not a built-in task: give one or more of arithmetic, humaneval"),
    (["--task", "mbpp,mbpp"], "--task names mbpp more than once"),
    (["--task", "humaneval", "--data", "x.jsonl"], "--data with --task gives the file of one task read from a file"),
    (["--task", "gsm8k,mbpp", "--data", "x.jsonl"], "not of --task gsm8k,mbpp"),
    ([], "give the problems: --task NAME[,NAME...]"),
    (["--task", "gsm8k"], "the gsm8k data is not cached at"),
])
def test_eval_task_errors_are_one_line_before_any_model_loads(capsys, loads, cache, argv, message):  # noqa: F811
    assert main([*BASE, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: ") and err.count("\n") == 1 and message in err, err
    assert loads == []
