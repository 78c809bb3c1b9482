"""Exact-answer verification against a reference (evaluation, and refinement with feedback)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metagen.scoring.answers import AnswerExtractor, answer_reader, answers_match
from metagen.scoring.base import Verdict, Verifier

if TYPE_CHECKING:
    from metagen.decoding.prompts import Prompt
    from metagen.decoding.result import Completion


class ExactAnswerVerifier(Verifier):
    """Passes when the candidate's answer equals `reference`.

    The answer is the candidate's `answer` field when a strategy has set it, else it is
    extracted from its text (`pattern` regex or `extractor` function, default extraction
    otherwise; `pattern` runs on RE2, see `answers.compile_pattern`). math: compare with
    math-verify ("0.5" = "1/2" = "\\frac{1}{2}"), within `MATH_TIMEOUT_SECONDS` (past it: incorrect).
    """

    name = "exact_answer"

    def __init__(
        self,
        reference: str,
        *,
        math: bool = True,
        pattern: str | None = None,
        extractor: AnswerExtractor | None = None,
    ) -> None:
        self.answer_of = answer_reader(pattern, extractor)
        self.reference = str(reference)
        self.math = math

    def verify(self, prompt: Prompt, candidate: Completion) -> Verdict:
        answer = self.answer_of(candidate)
        if answer is None:
            return Verdict(False, 0.0, "No final answer was found in the response.")
        if answers_match(answer, self.reference, self.math):
            return Verdict(True, 1.0, f"The answer {answer} is correct.")
        return Verdict(False, 0.0, f"The answer {answer} is incorrect.")
