"""Scorers, verifiers and answer extraction used by meta-generation strategies."""

from metagen.scoring.answers import AnswerExtractor, answers_match, extract_answer
from metagen.scoring.logprob import Scorer, mean_logprob, sum_logprob

__all__ = ["AnswerExtractor", "Scorer", "answers_match", "extract_answer", "mean_logprob", "sum_logprob"]
