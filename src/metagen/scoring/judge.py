"""LLM-as-a-judge: a language model reads a question and a response and says Yes or No; the
score is the probability it gives to "Yes" in the first token it would write.

    s(x, y) = Σ_{t ∈ top-k, text(t) ∈ yes_words} p(t | judge_prompt(x, y))
    normalize=True:  s = P(Yes) / (P(Yes) + P(No))

One generation call per judged prompt (max_tokens=1, greedy, the top 20 logprobs), so the
judge can be any `Generator` that reports `Completion.top_logprobs` and can `decode` token ids.
Only the top-k tokens are seen: P(Yes) is a lower bound that misses yes tokens ranked below k.
`LLMJudgeUtility` asks the same judge about pairs of responses, for MBR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost
from metagen.decoding.generator import Generator
from metagen.sampling import SamplingParams
from metagen.scoring.base import Scorer, Scores, prompt_text
from metagen.scoring.utilities import Utility

CORRECTNESS_TEMPLATE = (
    "Question: {question}\n\nResponse: {response}\n\nIs the response correct? Answer Yes or No."
)
AGREEMENT_TEMPLATE = (
    "Question: {question}\n\nResponse A: {hypothesis}\n\nResponse B: {reference}\n\n"
    "Do responses A and B give the same answer? Answer Yes or No."
)
AT_LEAST_AS_GOOD_TEMPLATE = (
    "Question: {question}\n\nResponse A: {hypothesis}\n\nResponse B: {reference}\n\n"
    "Is response A at least as good as response B? Answer Yes or No."
)


class LLMJudge(Scorer):
    """Scores each candidate by the judge's P("Yes") to `template` (fields {question}: the
    prompt's text, {response}: the candidate's text).

    yes_words, no_words: token texts (whitespace stripped, case-sensitive) counted as Yes / No;
        pass ("Yes", "yes", "YES") to accept any case.
    normalize: P(Yes) / (P(Yes) + P(No)), 0.5 when neither is among the top tokens; else the
        raw P(Yes), in [0, 1].
    logprobs: how many top tokens the judge call reports (at most 20).
    Time: one judge call (a prefill and one token) per candidate. Cost: the sum of their costs.
    """

    name = "llm_judge"

    def __init__(
        self,
        generator: Generator,
        template: str = CORRECTNESS_TEMPLATE,
        yes_words: Sequence[str] = ("Yes",),
        no_words: Sequence[str] = ("No",),
        normalize: bool = False,
        logprobs: int = 20,
    ) -> None:
        caps.require({caps.TOP_LOGPROBS}, generator, "an LLM judge (it reads the top logprobs of its first token)")
        if not yes_words:
            raise ValueError("yes_words is empty: give at least one word")
        if set(yes_words) & set(no_words):
            raise ValueError(f"{sorted(set(yes_words) & set(no_words))} are both yes and no words")
        self.generator = generator
        self.template = template
        self.yes_words = frozenset(yes_words)
        self.no_words = frozenset(no_words)
        self.normalize = normalize
        self.params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=logprobs, seed=0)
        self._texts: dict[int, str] = {}  # token id -> stripped text, decoded once

    def token_text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.generator.decode([token_id]).strip()
        return self._texts[token_id]

    def probability(self, judge_prompt: str) -> tuple[float, Cost]:
        """P(Yes) (or the normalized share) for one judge prompt, and the call's cost."""
        result = self.generator.generate(judge_prompt, self.params)
        top = result.completions[0].top_logprobs
        if not top:
            raise ValueError(
                f"the judge's generator {type(self.generator).__name__} reported no top logprobs; "
                "it must fill Completion.top_logprobs (LocalGenerator does)"
            )
        yes = no = 0.0
        for token_id, logprob in top[0].items():  # {token id: log p} of the first generated position
            text = self.token_text(token_id)
            if text in self.yes_words:
                yes += math.exp(logprob)
            elif text in self.no_words:
                no += math.exp(logprob)
        if self.normalize:
            value = yes / (yes + no) if yes + no > 0 else 0.5
        else:
            value = min(yes, 1.0)  # exp of rounded logprobs may sum a hair above 1
        return value, result.cost or Cost()

    def score(self, prompt, candidates) -> Scores:
        question = prompt_text(prompt)
        values, cost = [], Cost()
        for candidate in candidates:
            value, call_cost = self.probability(self.template.format(question=question, response=candidate.text))
            values.append(value)
            cost += call_cost
        return Scores(values, cost)


class LLMJudgeUtility(Utility):
    """u(y_i, y_j) = the judge's P("Yes") to `template` with {question}, {hypothesis}: y_i and
    {reference}: y_j. Default: do the two responses give the same answer
    (`AGREEMENT_TEMPLATE`); `AT_LEAST_AS_GOOD_TEMPLATE` asks whether y_i is at least as good as
    y_j. Other arguments as `LLMJudge`.
    Time: O(N²) judge calls, N(N − 1) when MBR leaves self-pairs out; Cost: their sum.
    """

    name = "llm_judge"

    def __init__(self, generator: Generator, template: str = AGREEMENT_TEMPLATE, **judge_options) -> None:
        self.judge = LLMJudge(generator, template, **judge_options)

    def matrix(self, prompt, candidates, *, diagonal=True):
        question = prompt_text(prompt)
        n = len(candidates)
        utilities, cost = np.full((n, n), np.nan), Cost()
        for i, hypothesis in enumerate(candidates):
            for j, reference in enumerate(candidates):
                if i == j and not diagonal:
                    continue
                judge_prompt = self.judge.template.format(
                    question=question, hypothesis=hypothesis.text, reference=reference.text)
                utilities[i, j], call_cost = self.judge.probability(judge_prompt)
                cost += call_cost
        return utilities, cost
