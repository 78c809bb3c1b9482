"""Exact-answer verification against a reference (evaluation, and refinement with feedback)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metagen.scoring.answers import AnswerExtractor, answers_match, compile_pattern, extract_answer
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
        if pattern is not None and extractor is not None:
            raise ValueError("give pattern or extractor, not both")
        if pattern is not None:
            compile_pattern(pattern)  # refused now (ValueError naming it), not at the first candidate
        self.reference = str(reference)
        self.math = math
        self.extract = extractor or (lambda text: extract_answer(text, pattern))

    def verify(self, prompt: Prompt, candidate: Completion) -> Verdict:
        answer = candidate.answer if candidate.answer is not None else self.extract(candidate.text)
        if answer is None:
            return Verdict(False, 0.0, "No final answer was found in the response.")
        if answers_match(answer, self.reference, self.math):
            return Verdict(True, 1.0, f"The answer {answer} is correct.")
        return Verdict(False, 0.0, f"The answer {answer} is incorrect.")
