"""Scorers, verifiers and answer extraction used by meta-generation strategies."""

from metagen.scoring.answers import AnswerExtractor, answers_match, extract_answer
from metagen.scoring.exact_answer import ExactAnswerVerifier
from metagen.scoring.base import FunctionScorer, Scorer, Scores, Verdict, Verifier, as_scorer, prompt_text
from metagen.scoring.logprob import mean_logprob, self_certainty, sum_logprob

__all__ = [
    "AnswerExtractor",
    "ExactAnswerVerifier",
    "FunctionScorer",
    "Scorer",
    "Scores",
    "Verdict",
    "Verifier",
    "answers_match",
    "as_scorer",
    "extract_answer",
    "mean_logprob",
    "prompt_text",
    "self_certainty",
    "sum_logprob",
]
