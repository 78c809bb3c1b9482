"""Whether a reply to a problem is right: its answer matched against the reference
(`scoring.answers`: extracted with the run's pattern or answer field, compared as math when
asked; a short-answer question by normalized exact match, `scoring.qa_match`), or a code
problem's program run against its hidden tests in the sandbox (`code_grading.grade`).

A code reply is graded once: a pool sample's grade is stored with it (`pool.known_grades`
reads them back by text), so a pooled strategy that chose a sample costs no sandbox run; a
text no sample holds (a live run's reply, or one a strategy built) is run, and remembered.
"""

from __future__ import annotations

from metagen.eval.code_grading import Grade, grade
from metagen.eval.tasks import Problem
from metagen.scoring.answers import answers_match, extract_answer
from metagen.scoring.qa_match import exact_match
from metagen.strategies.registry import StrategyOptions


def correct(answer: str | None, problem: Problem, options: StrategyOptions) -> bool:
    """Whether `answer` matches the problem's reference answer: by its own grading ("qa":
    normalized exact match), else as math when `options.math`, else as normalized strings."""
    if problem.grading == "qa":
        return exact_match(answer, problem.answer)
    return answers_match(answer, problem.answer, options.math)


def grade_reply(text: str, problem: Problem, config, known: dict[str, Grade] | None = None) -> Grade:
    """The grade of a reply to a code problem under an `EvalConfig`'s sandbox limits: the stored
    one when `known` holds its text (a pool sample), else a sandbox run (remembered in `known`)."""
    if known is not None and text in known:
        return known[text]
    graded = grade(problem, text, timeout=config.code_timeout, memory_mb=config.code_memory_mb)
    if known is not None:
        known[text] = graded
    return graded


def score(result, problem: Problem, config, known: dict[str, Grade] | None = None) -> bool:
    """Whether a strategy's chosen output (`result.chosen`) is right: the answer it set, else
    `reply_correct` of its text."""
    if not problem.is_code and result.chosen.answer is not None:
        return correct(result.chosen.answer, problem, config.options)
    return reply_correct(result.chosen.text, problem, config, known)


def reply_correct(text: str, problem: Problem, config, known: dict[str, Grade] | None = None) -> bool:
    """Whether a reply is right under an `EvalConfig`: a code problem's program run against the
    tests (`grade_reply`), else its answer extracted as the config's options say and matched."""
    if problem.is_code:
        return grade_reply(text, problem, config, known).passed
    answer = extract_answer(text, config.options.pattern, config.options.answer_field)
    return correct(answer, problem, config.options)
