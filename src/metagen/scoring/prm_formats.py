"""The input formats of the two process reward models metagen reads, shared by the local
checkpoints (`step_prm.CheckpointPRM`) and the served ones (`remote_prm.PoolingPRM`):

    shepherd (Wang et al. 2024, Math-Shepherd): the text "question step_1 ки\\nstep_2 ки", each
        step followed by the step tag; the score is read after each tag (good "+" against bad "-")
    qwen (Zhang et al. 2025, Qwen2.5-Math-PRM): the conversation [system, user: question,
        assistant: "step_1<extra_0>step_2<extra_0>"], each step followed by the separator

A marker text inside a step is removed, so a step cannot forge one.
"""

from __future__ import annotations

from collections.abc import Sequence

SHEPHERD, QWEN = "shepherd", "qwen"
STEP_TAG = "ки"  # Math-Shepherd's step tag and its good / bad tokens
GOOD_TOKEN, BAD_TOKEN = "+", "-"
SEPARATOR = "<extra_0>"  # Qwen2.5-Math-PRM's step separator
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def shepherd_text(question: str, steps: Sequence[str], tag: str = STEP_TAG) -> str:
    """Math-Shepherd's input: "question step_1 tag\\nstep_2 tag" (each step stripped, tags removed)."""
    return f"{question} " + "\n".join(f"{step.replace(tag, '').strip()} {tag}" for step in steps)


def qwen_messages(question: str, steps: Sequence[str], separator: str = SEPARATOR,
                  system: str = QWEN_SYSTEM) -> list[dict]:
    """Qwen2.5-Math-PRM's conversation: the answer is every step followed by the separator."""
    answer = "".join(step.replace(separator, "").strip() + separator for step in steps)
    return [{"role": "system", "content": system}, {"role": "user", "content": question},
            {"role": "assistant", "content": answer}]
