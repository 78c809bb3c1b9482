"""Scorers, verifiers, MBR utilities and answer extraction used by meta-generation strategies.

Light at import: the optional backends (sacrebleu, rapidfuzz, transformers, the sandbox) load
when a scorer that needs them is built or called.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it, imported on first use (`metagen._lazy`)
_EXPORTS = {
    "AnswerExtractor": "answers", "answers_match": "answers", "extract_answer": "answers",
    "FunctionScorer": "base", "Scorer": "base", "Scores": "base", "Verdict": "base", "Verifier": "base",
    "as_scorer": "base", "prompt_text": "base",
    "ExactAnswerVerifier": "exact_answer", "AnswerLikelihood": "likelihood",
    "mean_logprob": "logprob", "self_certainty": "logprob", "sum_logprob": "logprob",
    "Utility": "utilities", "ChrF": "utilities", "Bleu": "utilities", "EditSimilarity": "utilities",
    "AnswerAgreement": "utilities", "EmbeddingCosine": "embeddings", "LLMJudge": "judge",
    "LLMJudgeUtility": "judge", "RewardModelScorer": "reward_model", "CodeExecutionVerifier": "code_execution",
    "extract_program": "code_execution",
    "ValueHead": "value_head", "ValueScorer": "value_head", "collect_value_data": "value_training",
    "train_value_head": "value_training",
    "PrefixValue": "process_reward", "HeadValue": "process_reward", "FunctionValue": "process_reward",
    "StepRewardValue": "process_reward", "ProcessRewardModel": "process_reward", "ValueHeadPRM": "process_reward",
    "ArithmeticStepVerifier": "process_reward", "ScorerValue": "process_reward", "JudgePRM": "judge_prm",
    "RolloutQ": "rollout_q", "normalize_answer": "qa_match", "exact_match": "qa_match", "token_f1": "qa_match",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
