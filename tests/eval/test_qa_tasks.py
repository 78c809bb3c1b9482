"""Question-answering tasks: the HotpotQA reader on a tiny file of its format, the scores of
SQuAD / HotpotQA, grading by normalized exact match in the harness, and the tasks of
`metagen eval` (named in its help; the shipped corpus given to a retrieval strategy)."""

from __future__ import annotations

import json

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval import EvalConfig, Problem, evaluate, load_jsonl, write_jsonl
from metagen.eval.qa_tasks import CORPUS, QA_PATTERN, corpus_file, hotpotqa
from metagen.eval.standard_tasks import load_task
from metagen.retrieval import read_corpus
from metagen.sampling import SamplingParams
from metagen.scoring import exact_match, normalize_answer, token_f1
from metagen.strategies.registry import StrategyOptions

RECORDS = [
    {"_id": "q1", "question": "Which city hosts the tower designed by Gustave Eiffel's firm?", "answer": "Paris",
     "type": "bridge", "level": "easy",
     "supporting_facts": [["Eiffel Tower", 0], ["Paris", 1]],
     "context": [["Eiffel Tower", ["The Eiffel Tower is a lattice tower.", " It was built by Eiffel's company."]],
                 ["Paris", ["Paris is the capital of France.", " It lies on the Seine."]]]},
    {"_id": "q2", "question": "Is the Seine longer than the Loire?", "answer": "no",
     "supporting_facts": [["Seine", 0], ["Loire", 0]],
     "context": [["Paris", ["A different text for a title seen before."]],
                 ["Seine", ["The Seine is 777 km long."]], ["Loire", ["The Loire is 1,006 km long."]]]},
]


def _write(path, records, jsonl):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n" if jsonl else json.dumps(records))
    return path


@pytest.mark.parametrize("jsonl", [False, True])
def test_hotpotqa_gives_its_questions_and_one_passage_per_context_title(tmp_path, jsonl):
    path = _write(tmp_path / ("dev.jsonl" if jsonl else "dev.json"), RECORDS, jsonl)
    problems, passages = hotpotqa(path)
    assert problems == [Problem("q1", RECORDS[0]["question"], "Paris", grading="qa"),
                        Problem("q2", RECORDS[1]["question"], "no", grading="qa")]
    assert [(p.id, p.title, p.text) for p in passages] == [
        ("Eiffel Tower", "Eiffel Tower", "The Eiffel Tower is a lattice tower. It was built by Eiffel's company."),
        ("Paris", "Paris", "Paris is the capital of France. It lies on the Seine."),  # the first text kept
        ("Seine", "Seine", "The Seine is 777 km long."),
        ("Loire", "Loire", "The Loire is 1,006 km long.")]
    written = corpus_file(passages, tmp_path / "cache", path)
    assert [(p.id, p.text) for p in read_corpus(written)] == [(p.id, p.text) for p in passages]
    assert corpus_file(passages, tmp_path / "cache", path) == written  # the same source: the same file


@pytest.mark.parametrize(("change", "message"), [
    ({"_id": 7}, "field '_id' is 7: must be non-empty text"),
    ({"answer": ""}, "field 'answer' is '': must be non-empty text"),
    ({"question": None}, "field 'question' is None"),
    ({"supporting_facts": [["Paris", "1"]]}, "field 'supporting_facts' is [['Paris', '1']]: must be a list of "
                                             "[title, sentence index] pairs"),
    ({"context": [["Paris", "one sentence"]]}, "field 'context' is [['Paris', 'one sentence']]: must be a list of "
                                               "[title, [sentence, ...]] pairs"),
])
@pytest.mark.parametrize("jsonl", [False, True])
def test_a_malformed_hotpotqa_record_is_refused_by_field_and_place(tmp_path, change, message, jsonl):
    path = _write(tmp_path / ("dev.jsonl" if jsonl else "dev.json"), [RECORDS[0], {**RECORDS[1], **change}], jsonl)
    where = f"{path}:2: " if jsonl else f"{path}: record 1: "
    with pytest.raises(ValueError) as error:
        hotpotqa(path)
    assert str(error.value).startswith(where + message.split(" is ")[0]) and message in str(error.value)


def test_a_hotpotqa_file_of_another_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="expected a JSON list of records, got dict"):
        hotpotqa(_write(tmp_path / "dev.json", {"data": RECORDS}, False))
    with pytest.raises(ValueError, match=r"record 0: expected a JSON object, got str"):
        hotpotqa(_write(tmp_path / "dev.json", ["q1"], False))
    with pytest.raises(ValueError, match="id 'q1' appears more than once"):
        hotpotqa(_write(tmp_path / "dev.json", [RECORDS[0], RECORDS[0]], False))
    with pytest.raises(ValueError, match="give --data PATH"):
        load_task("hotpotqa")


def test_the_scores_of_squad_and_hotpotqa():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert exact_match("the Nile.", "Nile") and not exact_match("Nile river", "Nile") and not exact_match(None, "x")
    assert token_f1("Addis Ababa city", "Addis Ababa") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))  # 0.8
    assert token_f1("x b b", "b b c") == pytest.approx(2 / 3)  # multiset overlap 2: precision = recall = 2/3
    assert token_f1("a b b", "b b c") == pytest.approx(0.8)  # the article "a" dropped: precision 1
    assert token_f1("no", "no") == 1.0 and token_f1("no doubt", "no") == 0.0  # yes / no: exact only
    assert token_f1("Rome", "Paris") == 0.0 and token_f1(None, "Paris") == 0.0


class Scripted(Generator):
    """Replies with the text `replies[question]` (every sample alike); no model."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies

    def generate(self, prompt, params, *, generator=None):
        text = self.replies[prompt if isinstance(prompt, str) else prompt[-1]["content"]]
        completions = [Completion(text, [1, 2], [-0.1, -0.2], finish_reason="stop") for _ in range(params.n)]
        return GenerationResult(completions, [1], cost=Cost(model_calls=1, generated_tokens=2 * params.n, flops=1.0))


def test_a_qa_problem_is_graded_by_normalized_exact_match_of_the_whole_answer(tmp_path):
    problems = [Problem("a", "Capital of Ethiopia?", "Addis Ababa", grading="qa"),
                Problem("b", "Capital of Mali?", "Bamako", grading="qa"),
                Problem("c", "Highest point of Germany?", "Zugspitze", grading="qa"),
                Problem("d", "Capital of Ethiopia, graded as math?", "Addis Ababa")]
    replies = {"Capital of Ethiopia?": "Let me see.\nThe answer is addis ababa.",  # case and period ignored
               "Capital of Mali?": "The answer is Timbuktu.",
               "Highest point of Germany?": "The answer is: the Zugspitze\nDone.",  # article ignored
               "Capital of Ethiopia, graded as math?": "The answer is addis  Ababa."}
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(temperature=0.0, max_tokens=8),
                        options=StrategyOptions(pattern=QA_PATTERN))
    report = evaluate(Scripted(replies), problems, config, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    graded = {row["id"]: (row["answer"], row["correct"]) for row in rows if row["kind"] == "live"}
    assert graded == {"a": ("addis ababa", True), "b": ("Timbuktu", False), "c": ("the Zugspitze", True),
                      "d": ("addis  Ababa", True)}  # the run's own comparison: normalized strings
    [point] = [p for p in report.points if p.strategy == "greedy"]
    assert point.accuracy == pytest.approx(3 / 4)


def test_the_shipped_tasks_grade_the_gold_answer_right_and_the_suggested_one_wrong(tmp_path):
    from metagen.eval.qa_tasks import S2A

    multihop, s2a = load_task("multihop"), load_task("s2a_distractors")
    assert multihop.corpus == CORPUS and s2a.corpus is None and multihop.pattern == s2a.pattern == QA_PATTERN
    suggested = {json.loads(line)["id"]: json.loads(line)["suggested"] for line in S2A.read_text().splitlines()}
    problems = multihop.problems[:6] + s2a.problems[:6]
    replies = {p.question: f"Thinking it over.\nThe answer is {p.answer}." for p in multihop.problems[:6]}
    replies |= {p.question: f"The answer is {suggested[p.id] or 'unsure'}." for p in s2a.problems[:6]}
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(temperature=0.0, max_tokens=8),
                        options=StrategyOptions(pattern=multihop.pattern))
    evaluate(Scripted(replies), problems, config, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    correct = {row["id"]: row["correct"] for row in rows if row["kind"] == "live"}
    assert correct == {p.id: p in multihop.problems for p in problems}


def test_grading_survives_a_jsonl_round_trip_and_is_checked(tmp_path):
    problems = [Problem("a", "q?", "Paris", grading="qa"), Problem("b", "1+1?", "2")]
    write_jsonl(problems, tmp_path / "p.jsonl")
    assert load_jsonl(tmp_path / "p.jsonl") == problems
    assert problems[0].reference != problems[1].reference.replace("2", "Paris")  # another comparison, another key
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "a", "grading": "fuzzy"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'grading' is 'fuzzy'"):
        load_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="grading='fuzzy' must be one of"):
        Problem("x", "q", "a", grading="fuzzy")


def test_a_run_gives_the_retriever_to_the_strategies_that_search_and_records_it():
    config = EvalConfig(("greedy", "self_ask_search"), ns=(1,), overrides=(("retriever", f"bm25:{CORPUS}"),))
    assert config.overrides_for("self_ask_search") == {"retriever": f"bm25:{CORPUS}"}
    assert config.overrides_for("greedy") == {}
    assert config.setup()["overrides"] == {"retriever": f"bm25:{CORPUS}"}
    assert "overrides" not in EvalConfig(("greedy",), ns=(1,)).setup()  # set-ups stored before stay readable
    with pytest.raises(ValueError, match="retriever is required by strategy 'self_ask_search'"):
        EvalConfig(("self_ask_search",), ns=(1,))
    with pytest.raises(ValueError, match="retriever is an option of none of the strategies greedy"):
        EvalConfig(("greedy",), ns=(1,), overrides=(("retriever", f"bm25:{CORPUS}"),))
    with pytest.raises(ValueError, match="passages=0 is out of range"):
        EvalConfig(("search",), ns=(1,), overrides=(("retriever", f"bm25:{CORPUS}"), ("passages", 0)))


def test_a_run_gives_dsp_its_training_file(tmp_path):
    from metagen.cli.eval import EVAL_STRATEGY_OPTIONS

    assert "train" in EVAL_STRATEGY_OPTIONS  # `metagen eval --train FILE`
    train = tmp_path / "train.jsonl"
    train.write_text('{"question": "Capital of France?", "answer": "Paris"}\n')
    given = (("retriever", f"bm25:{CORPUS}"), ("train", str(train)))
    config = EvalConfig(("dsp", "self_ask_search"), ns=(1,), overrides=given)
    assert config.overrides_for("dsp") == {"retriever": f"bm25:{CORPUS}", "train": str(train)}
    assert config.overrides_for("self_ask_search") == {"retriever": f"bm25:{CORPUS}"}
    with pytest.raises(ValueError, match="is not a file"):
        EvalConfig(("dsp",), ns=(1,), overrides=(("retriever", f"bm25:{CORPUS}"), ("train", str(tmp_path / "no"))))


# `metagen eval` with the question-answering tasks, on the toy model (tests/eval/test_eval_cli.py)
from metagen.cli import common, main  # noqa: E402
from tests.eval.test_eval_cli import TextToy, TextToyTokenizer  # noqa: E402


class ChatToyTokenizer(TextToyTokenizer):
    """TextToyTokenizer with a chat template: "role: content" lines (a chain continues the last)."""

    chat_template = "role: content"

    def encode_chat(self, messages, add_generation_prompt=True, continue_final_message=False, **variables):
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return self.encode(text + ("\nassistant: " if add_generation_prompt else ""), add_special_tokens=False)


@pytest.fixture
def loads(monkeypatch, one_thread):
    """`metagen eval` loads a TextToy with a chat template (chains send chat messages)."""

    def load(args):
        model = TextToy(args.model or "")
        model.tokenizer = ChatToyTokenizer()
        return model

    monkeypatch.setattr(common, "load_model", load)


def test_eval_help_names_the_question_answering_tasks(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("multihop:", "s2a_distractors:", "hotpotqa:", "--retriever", "--passages"):
        assert name in text


def test_the_multihop_task_gives_its_corpus_to_a_retrieval_strategy(tmp_path, monkeypatch, capsys, loads):
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))  # the BM25 index is built there
    argv = ["eval", "--task", "multihop", "--limit", "1", "--strategy", "self_ask_search", "--n", "1",
            "--max-tokens", "3", "--json", "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    setup = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])["setup"]
    assert setup["overrides"] == {"retriever": f"bm25:{CORPUS}"}
    assert setup["options"]["pattern"] == QA_PATTERN
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert (row["strategy"], row["task"]) == ("self_ask_search", "multihop")


def test_the_multihop_task_gives_dsp_its_demonstration_questions_unless_train_is_given(tmp_path):
    import argparse

    from metagen.cli.eval import _overrides
    from metagen.eval.qa_tasks import MULTIHOP_DEMOS
    from metagen.eval.standard_tasks import load_task
    from metagen.strategies.dsp import read_examples

    task = load_task("multihop")
    given = {"strategy_retriever": None, "strategy_passages": None, "strategy_train": None}
    assert dict(_overrides(argparse.Namespace(**given), task, ("dsp", "self_ask"))) == {
        "retriever": f"bm25:{CORPUS}", "train": str(MULTIHOP_DEMOS)}
    assert dict(_overrides(argparse.Namespace(**given), task, ("self_ask_search",))) == {"retriever": f"bm25:{CORPUS}"}
    own = tmp_path / "mine.jsonl"
    assert dict(_overrides(argparse.Namespace(**{**given, "strategy_train": str(own)}), task, ("dsp",)))["train"] == \
        str(own)
    evaluated = {problem.question for problem in task.problems}
    assert not evaluated & {question for question, _ in read_examples(MULTIHOP_DEMOS)}


def test_a_retriever_kind_alone_searches_the_tasks_corpus():
    import argparse

    from metagen.cli.eval import _overrides
    from metagen.eval.standard_tasks import load_task

    given = {"strategy_retriever": "dense", "strategy_passages": None, "strategy_train": None}
    task = load_task("multihop")
    assert dict(_overrides(argparse.Namespace(**given), task, ("self_ask_search",))) == {"retriever": f"dense:{CORPUS}"}
    given["strategy_retriever"] = "bm25"
    assert dict(_overrides(argparse.Namespace(**given), task, ("self_ask_search",))) == {"retriever": f"bm25:{CORPUS}"}
    given["strategy_retriever"] = "bm25?title_weight=3"  # with its settings
    assert dict(_overrides(argparse.Namespace(**given), task, ("self_ask_search",))) == {
        "retriever": f"bm25:{CORPUS}?title_weight=3"}
    with pytest.raises(ValueError, match=r"--retriever bm25\?title_weight=3 names no corpus, and this task has "
                                         r"none: give --retriever bm25:PATH\?title_weight=3"):
        _overrides(argparse.Namespace(**given), load_task("s2a_distractors"), ("self_ask_search",))


def test_hotpotqa_through_the_command_line_searches_its_own_corpus(tmp_path, monkeypatch, capsys, loads):
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("METAGEN_DATA", str(tmp_path / "data"))
    data = _write(tmp_path / "dev.json", RECORDS, False)
    argv = ["eval", "--task", "hotpotqa", "--data", str(data), "--strategy", "search", "--n", "1",
            "--max-tokens", "3", "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    setup = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])["setup"]
    [written] = (tmp_path / "data").glob("hotpotqa-corpus-*.jsonl")
    assert setup["overrides"] == {"retriever": f"bm25:{written}"}
    assert [p.id for p in read_corpus(written)] == ["Eiffel Tower", "Paris", "Seine", "Loire"]


def test_retrieval_options_are_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    base = ["eval", "--task", "multihop", "--n", "1", "--no-chat"]
    assert main([*base, "--strategy", "greedy", "--retriever", f"bm25:{CORPUS}"]) == 2
    assert "retriever is an option of none of the strategies greedy" in capsys.readouterr().err
    assert main([*base, "--strategy", "search", "--retriever", "bm25:/no/such.jsonl"]) == 2
    assert "corpus '/no/such.jsonl' does not exist" in capsys.readouterr().err
    assert main(["eval", "--task", "s2a_distractors", "--n", "1", "--strategy", "self_ask_search"]) == 2
    assert "retriever is required by strategy 'self_ask_search'" in capsys.readouterr().err  # no corpus of its own
    assert main(["eval", "--task", "hotpotqa", "--n", "1", "--strategy", "greedy"]) == 2
    assert "give --data PATH" in capsys.readouterr().err
