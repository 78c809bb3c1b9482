"""An LLM judge as a process reward: one Yes/No question per step.

    score(step k) = P("Yes" | question, steps 1..k−1 as context, step k, "Is step k correct?")

Built on `LLMJudge.probability` (the judge's P(Yes) among its top-20 first tokens, normalized
against P(No) by default), so any `Generator` that reports top logprobs can judge. Time: one
judge call per step (a prefill of question + steps so far, one token). Cost: their sum, all of
it counted as scorer FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence

from metagen.decoding.cost import Cost
from metagen.scoring.judge import LLMJudge
from metagen.scoring.process_reward import ProcessRewardModel, Values

STEP_TEMPLATE = (
    "Question: {question}\n\nSolution so far:\n{previous}\n\nNext step: {step}\n\n"
    "Is the next step correct? Answer Yes or No."
)


class JudgePRM(ProcessRewardModel):
    """Per-step P(Yes) of an LLM judge asked `template` ({question}, {previous}: the steps
    before, or "(none)", {step}: the judged step). Other arguments as `LLMJudge`."""

    def __init__(self, generator, template: str = STEP_TEMPLATE, normalize: bool = True, **judge_options) -> None:
        for name in ("{question}", "{previous}", "{step}"):
            if name not in template:
                raise ValueError(f"template lacks the field {name}")
        self.judge = LLMJudge(generator, template, normalize=normalize, **judge_options)

    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        values, cost = [], Cost()
        for k, step in enumerate(steps):
            previous = "".join(steps[:k]).strip() or "(none)"
            judge_prompt = self.judge.template.format(question=prompt, previous=previous, step=step.strip())
            value, call_cost = self.judge.probability(judge_prompt)
            values.append(value)
            cost += call_cost
        cost.scorer_flops = cost.flops
        return Values(values, cost)
