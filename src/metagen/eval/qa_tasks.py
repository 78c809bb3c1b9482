"""Short-answer question answering tasks: the shipped multi-hop and System 2 Attention sets, and
HotpotQA read from the user's copy.

    problems = multihop_problems()             # 89 two-hop bridge questions (shipped)
    demos = multihop_problems(MULTIHOP_DEMOS)  # 20 more, for demonstrations (dsp's --train)
    problems = s2a_problems()                  # 60 questions inside distracting contexts (shipped)
    problems, passages = hotpotqa("hotpot_dev_distractor_v1.json")   # questions + their corpus

  multihop         two-hop bridge questions over `CORPUS`, 388 paragraphs of The World Factbook
                   (public domain; src/metagen/data/README.md): hop 1 names a country the
                   question does not ("the country that annexed Austria in 1938"), hop 2 is that
                   country's facts paragraph, which holds the answer. A retrieval strategy
                   (`self_ask_search`, `search`, `dsp`) searches `CORPUS` unless told otherwise.
                   `MULTIHOP_DEMOS` holds 20 further questions whose paragraphs no evaluated
                   question uses (whole groups of questions linked by a shared paragraph), the
                   labelled examples `dsp` bootstraps its demonstrations from unless told
                   otherwise: a demonstration never shows an evaluated question's passages.
  s2a_distractors  a capital city asked inside a context that holds the relevant fact, two
                   irrelevant sentences and an opinion that suggests a wrong answer or doubts
                   the right one (Weston & Sukhbaatar 2023, System 2 Attention); the prompt is
                   the context, a blank line, then the question.
  hotpotqa         HotpotQA's JSON (a list of records) or JSONL (one a line) with fields _id,
                   question, answer, supporting_facts [[title, sentence index], ...] and
                   context [[title, [sentence, ...]], ...] (Yang et al. 2018). Its corpus is every
                   context paragraph, one passage per title (id and title the title, text its
                   sentences joined), the first occurrence kept: with the distractor setting's
                   files, the gold and distractor paragraphs of every question.

Every problem is graded by normalized exact match (`Problem.grading` "qa",
`scoring.qa_match`), and a strategy's answer is read with `QA_PATTERN` unless the run gives
--pattern: the rest of the line after "answer is", so that a many-word answer ("Addis Ababa") is
read whole. Loading is O(file bytes); errors name the file, the line (or record) and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

from metagen.eval.tasks import Problem
from metagen.jsonl import json_records
from metagen.retrieval.base import Passage
from metagen.strategies.chain_programs import ANSWER_LINE

DATA = Path(__file__).resolve().parents[1] / "data"  # shipped as package data (pyproject.toml)
CORPUS = DATA / "factbook_corpus.jsonl"
MULTIHOP = DATA / "factbook_multihop.jsonl"
MULTIHOP_DEMOS = DATA / "factbook_multihop_demos.jsonl"
S2A = DATA / "factbook_s2a.jsonl"
# "The answer is Addis Ababa." -> "Addis Ababa": the rest of the line, a final period dropped (RE2)
QA_PATTERN = r"answer is:?[ \t]*(.+?)\.?[ \t]*(?:\n|$)"
QA_INSTRUCTION = f"\n\nAnswer {ANSWER_LINE}."  # what a prompt asks so that QA_PATTERN can read the reply


def multihop_problems(path: str | Path | None = None) -> list[Problem]:
    """The two-hop questions of `path` (default: the shipped `MULTIHOP`), fields id, question,
    answer and supporting_ids (two paragraph ids: hop 1, hop 2); ValueError naming file, line
    and field."""
    path = MULTIHOP if path is None else Path(path)
    problems = []
    for number, record in json_records(path):
        where = f"{path}:{number}"
        fields = _text_fields(record, ("id", "question", "answer"), where)
        supporting = record.get("supporting_ids")
        if not (isinstance(supporting, list) and len(supporting) == 2 and all(isinstance(i, str) for i in supporting)):
            raise ValueError(f"{where}: field 'supporting_ids' is {supporting!r:.80}: must be two paragraph ids "
                             "[hop 1, hop 2]")
        problems.append(Problem(fields["id"], fields["question"], fields["answer"], grading="qa"))
    return _checked(problems, path)


def s2a_problems(path: str | Path | None = None) -> list[Problem]:
    """The System 2 Attention questions of `path` (default: the shipped `S2A`), fields id,
    context, question and answer; the prompt is the context, a blank line, the question and
    `QA_INSTRUCTION` (without it a model answers "The capital of Mali is Bamako.", which the
    answer pattern cannot read)."""
    path = S2A if path is None else Path(path)
    problems = []
    for number, record in json_records(path):
        fields = _text_fields(record, ("id", "context", "question", "answer"), f"{path}:{number}")
        prompt = f"{fields['context']}\n\n{fields['question']}{QA_INSTRUCTION}"
        problems.append(Problem(fields["id"], prompt, fields["answer"], grading="qa"))
    return _checked(problems, path)


def hotpotqa(path: str | Path) -> tuple[list[Problem], list[Passage]]:
    """(questions, corpus) of a HotpotQA file (see the module): JSON holding a list of records,
    or JSONL; ValueError naming the file, the record (JSON: its index from 0) or line (JSONL)
    and the field of a malformed record."""
    path = Path(path)
    problems, passages, seen = [], [], {}
    for where, record in _hotpot_records(path):
        fields = _text_fields(record, ("_id", "question", "answer"), where)
        facts = record.get("supporting_facts")
        if not isinstance(facts, list) or not all(
                isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and _is_int(f[1]) for f in facts):
            raise ValueError(f"{where}: field 'supporting_facts' is {facts!r:.80}: must be a list of "
                             "[title, sentence index] pairs")
        context = record.get("context")
        if not isinstance(context, list) or not all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], list)
                and all(isinstance(s, str) for s in c[1]) for c in context):
            raise ValueError(f"{where}: field 'context' is {context!r:.80}: must be a list of "
                             "[title, [sentence, ...]] pairs")
        for title, sentences in context:
            if title not in seen:
                seen[title] = len(passages)
                passages.append(Passage(title, " ".join("".join(sentences).split()), 0.0, title))
        problems.append(Problem(fields["_id"], fields["question"], fields["answer"], grading="qa"))
    return _checked(problems, path), passages


def corpus_file(passages: list[Passage], directory: str | Path, source: str | Path) -> Path:
    """`passages` written as a corpus JSONL ({"id", "title", "text"} a line) in `directory`, named
    by the SHA-256 of `source`'s bytes (the same source, the same file: written once); written to
    a private name first, then renamed, so a reader never sees a partial file."""
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
    target = Path(directory) / f"hotpotqa-corpus-{digest}.jsonl"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with open(staging, "w", encoding="utf-8") as handle:
        for passage in passages:
            handle.write(json.dumps({"id": passage.id, "title": passage.title, "text": passage.text},
                                    ensure_ascii=False) + "\n")
    staging.replace(target)
    return target


def _hotpot_records(path: Path):
    """(where, record) of a HotpotQA JSON list or JSONL file."""
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        yield from ((f"{path}:{number}", record) for number, record in json_records(path))
        return
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a JSON file ({error}); HotpotQA's files are a JSON list (or give .jsonl)") \
            from None
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record {index}: expected a JSON object, got {type(record).__name__}")
        yield f"{path}: record {index}", record


def _text_fields(record: dict, names: tuple[str, ...], where: str) -> dict:
    """{name: value} of the string fields `names`; ValueError naming `where` and the field."""
    found = {}
    for name in names:
        value = record.get(name)
        if not isinstance(value, str) or not value.strip():
            shown = "missing" if name not in record else f"{value!r:.60}"
            raise ValueError(f"{where}: field {name!r} is {shown}: must be non-empty text")
        found[name] = value
    return found


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(problems: list[Problem], path: Path) -> list[Problem]:
    """`problems`, or ValueError naming `path` when it holds none or repeats an id."""
    if not problems:
        raise ValueError(f"{path}: no problems found")
    repeated = sorted(i for i, count in Counter(problem.id for problem in problems).items() if count > 1)
    if repeated:
        raise ValueError(f"{path}: id {repeated[0]!r} appears more than once")
    return problems
