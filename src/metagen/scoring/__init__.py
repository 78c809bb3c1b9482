"""Scorers, verifiers, MBR utilities and answer extraction used by meta-generation strategies.

Light at import: the optional backends (sacrebleu, rapidfuzz, transformers, the sandbox) load
when a scorer that needs them is built or called.
"""

from metagen.scoring.answers import AnswerExtractor, answers_match, extract_answer
from metagen.scoring.base import FunctionScorer, Scorer, Scores, Verdict, Verifier, as_scorer, prompt_text
from metagen.scoring.exact_answer import ExactAnswerVerifier
from metagen.scoring.logprob import mean_logprob, self_certainty, sum_logprob

_LAZY = {
    "Utility": "utilities", "ChrF": "utilities", "Bleu": "utilities", "EditSimilarity": "utilities",
    "AnswerAgreement": "utilities", "EmbeddingCosine": "embeddings", "LLMJudge": "judge",
    "LLMJudgeUtility": "judge", "RewardModelScorer": "reward_model", "CodeExecutionVerifier": "code_execution",
    "run_python": "sandbox", "SandboxResult": "sandbox", "SandboxError": "sandbox",
    "extract_program": "code_execution",
    "ValueHead": "value_head", "ValueScorer": "value_head", "collect_value_data": "value_training",
    "train_value_head": "value_training",
    "PrefixValue": "process_reward", "HeadValue": "process_reward", "FunctionValue": "process_reward",
    "StepRewardValue": "process_reward", "ProcessRewardModel": "process_reward", "ValueHeadPRM": "process_reward",
    "ArithmeticStepVerifier": "process_reward", "JudgePRM": "judge_prm",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"metagen.scoring.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'metagen.scoring' has no attribute {name!r}")


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
    *_LAZY,
]
