"""LLM-as-a-judge: exact P(Yes) from scripted top logprobs, the pairwise judge utility inside MBR,
and the real model as judge."""

import math
import re

import numpy as np
import pytest

from metagen.decoding import capabilities as caps
from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.scoring.judge import AT_LEAST_AS_GOOD_TEMPLATE, LLMJudge, LLMJudgeUtility
from metagen.strategies.mbr import MBRConfig, mbr
from tests.strategies.test_voting_strategies import CannedGenerator

VOCABULARY = {0: " Yes", 1: "Yes", 2: "No", 3: "yes", 4: "Maybe", 5: " No\n"}


class ScriptedJudge(Generator):
    """A judge whose first-token distribution {token id: p} is distribution(prompt); each call
    costs one model call and 10 FLOPs. Records prompts and params."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS, caps.TOP_LOGPROBS})

    def __init__(self, distribution):
        self.distribution = distribution
        self.prompts, self.params = [], []

    def decode(self, token_ids):
        return "".join(VOCABULARY[t] for t in token_ids)

    def generate(self, prompt, params, *, generator=None):
        self.prompts.append(prompt)
        self.params.append(params)
        top = {token: math.log(p) for token, p in self.distribution(prompt).items()}
        completion = Completion(text="x", token_ids=[max(top, key=top.get)], logprobs=[max(top.values())],
                                top_logprobs=[top], finish_reason="length")
        return GenerationResult([completion], [0, 1, 2], cost=Cost(model_calls=1, prompt_tokens_computed=3,
                                                                   generated_tokens=1, flops=10.0))


def by_response(prompt):
    if "Paris" in prompt:
        return {0: 0.3, 1: 0.1, 2: 0.2, 3: 0.15, 4: 0.05, 5: 0.1}
    return {2: 0.5, 5: 0.2, 0: 0.05, 4: 0.25}


def test_judge_sums_the_probability_of_tokens_that_read_yes():
    generator = ScriptedJudge(by_response)
    candidates = [Completion("It is Paris."), Completion("It is Rome.")]
    scores = LLMJudge(generator)("What is the capital of France?", candidates)
    assert scores.values == pytest.approx([0.3 + 0.1, 0.05])  # " Yes" and "Yes"; "yes" is another word
    assert scores.cost == Cost(model_calls=2, prompt_tokens_computed=6, generated_tokens=2, flops=20.0)
    assert generator.prompts[0] == ("Question: What is the capital of France?\n\nResponse: It is Paris.\n\n"
                                    "Is the response correct? Answer Yes or No.")
    params = generator.params[0]
    assert (params.max_tokens, params.temperature, params.logprobs, params.n) == (1, 0.0, 20, 1)

    normalized = LLMJudge(ScriptedJudge(by_response), normalize=True)("q", candidates)
    assert normalized.values == pytest.approx([0.4 / (0.4 + 0.3), 0.05 / (0.05 + 0.7)])
    any_case = LLMJudge(ScriptedJudge(by_response), yes_words=("Yes", "yes"))("q", candidates)
    assert any_case.values == pytest.approx([0.55, 0.05])
    neither = LLMJudge(ScriptedJudge(lambda p: {4: 1.0}), normalize=True)("q", candidates[:1])
    assert neither.values == [0.5]  # no evidence either way


def test_judge_needs_top_logprobs():
    with pytest.raises(ValueError, match="LLM judge .* needs top_logprobs, which CannedGenerator does not provide"):
        LLMJudge(CannedGenerator([("Yes", [-0.1])]))  # refused when built, before any question is asked
    with pytest.raises(ValueError, match="both yes and no"):
        LLMJudge(ScriptedJudge(by_response), yes_words=("Yes",), no_words=("Yes", "No"))


def agreement(prompt):
    """Yes with p = 0.9 when responses A and B start with the same word, else 0.2."""
    first_a = re.search(r"Response A: (\w+)", prompt).group(1)
    first_b = re.search(r"Response B: (\w+)", prompt).group(1)
    return {1: 0.9, 2: 0.1} if first_a == first_b else {1: 0.2, 2: 0.8}


def test_judge_utility_matrix_calls_and_mbr_choice():
    generator = ScriptedJudge(agreement)
    candidates = [Completion("red apple"), Completion("green pear"), Completion("red cherry")]
    utility = LLMJudgeUtility(generator)
    full, cost = utility("Name a fruit.", candidates)
    np.testing.assert_allclose(full, [[0.9, 0.2, 0.9], [0.2, 0.9, 0.2], [0.9, 0.2, 0.9]])
    assert cost.model_calls == 9 and len(generator.prompts) == 9
    assert generator.prompts[1].startswith("Question: Name a fruit.\n\nResponse A: red apple\n\nResponse B: green pear")
    partial, cost = utility("Name a fruit.", candidates, diagonal=False)
    assert cost.model_calls == 6 and np.isnan(np.diag(partial)).all()  # N(N − 1): self-pairs skipped

    outputs = [(c.text, [-1.0]) for c in candidates]
    config = MBRConfig(n=3, include_self=False)
    result = mbr(CannedGenerator(outputs), "Name a fruit.", config, LLMJudgeUtility(ScriptedJudge(agreement)))
    assert [c.score for c in result.completions] == pytest.approx([0.55, 0.2, 0.55])
    assert result.text == "red apple"
    assert result.cost.model_calls == 3 + 6 and result.cost.flops == 60.0

    better = LLMJudgeUtility(ScriptedJudge(agreement), AT_LEAST_AS_GOOD_TEMPLATE)
    better("q", candidates[:2])
    assert "Is response A at least as good as response B?" in better.judge.generator.prompts[0]


@pytest.mark.slow
def test_real_model_as_judge(model):
    from metagen.decoding import LocalGenerator

    judge = LLMJudge(LocalGenerator(model))
    candidates = [Completion("The capital of France is Paris."), Completion("The capital of France is Berlin.")]
    scores = judge("What is the capital of France?", candidates)
    assert all(0.0 <= v <= 1.0 for v in scores.values)
    assert scores.cost.model_calls == 2 and scores.cost.flops > 0 and scores.cost.generated_tokens == 2
    # Greedy and deterministic. SmolLM2-135M is a weak judge: P(Yes) is small for both answers
    # (measured 0.038 vs 0.031) and on other questions it often cannot tell right from wrong
    # (e.g. "a dog has four legs" vs "nine legs" score the same), but it does rank these two.
    assert scores.values[0] > scores.values[1]
    normalized = LLMJudge(LocalGenerator(model), normalize=True)("What is the capital of France?", candidates)
    assert all(0.0 <= v <= 1.0 for v in normalized.values) and normalized.values[0] > normalized.values[1]

    utilities, cost = LLMJudgeUtility(LocalGenerator(model))("Name a color.", [Completion("Blue."), Completion("Red.")],
                                                             diagonal=False)
    assert cost.model_calls == 2 and np.isfinite(utilities[~np.eye(2, dtype=bool)]).all()
    assert ((0 <= utilities[~np.eye(2, dtype=bool)]) & (utilities[~np.eye(2, dtype=bool)] <= 1)).all()


class SamplerAndJudge(ScriptedJudge):
    """One model that both samples (calls with n > 1: `texts`) and judges (greedy one-token calls:
    `agreement`), as the registry's mbr_judge uses the run's own generator for both."""

    def __init__(self, texts):
        super().__init__(agreement)
        self.texts = texts

    def generate(self, prompt, params, *, generator=None):
        if params.max_tokens != 1:
            self.prompts.append(prompt)
            completions = [Completion(text=text, token_ids=[1], logprobs=[-1.0]) for text in self.texts[:params.n]]
            return GenerationResult(completions, [0], cost=Cost(model_calls=1, flops=100.0))
        return super().generate(prompt, params, generator=generator)


def test_mbr_judge_in_the_registry_judges_with_the_run_generator():
    from metagen.sampling import SamplingParams
    from metagen.strategies.registry import get_strategy
    from metagen.strategies.spec import StrategyOptions

    generator = SamplerAndJudge(["red apple", "green pear", "red cherry"])
    result = get_strategy("mbr_judge").run(generator, "Name a fruit.", 3, SamplingParams(max_tokens=16),
                                           StrategyOptions(), None)
    # include_self: each row sums 0.9 for itself plus the judge's agreement with the two others
    assert [c.score for c in result.completions] == pytest.approx([(0.9 + 0.2 + 0.9) / 3, (0.2 + 0.9 + 0.2) / 3,
                                                                   (0.9 + 0.2 + 0.9) / 3])
    assert result.text == "red apple"
    assert len(generator.prompts) == 1 + 9 and result.cost.model_calls == 1 + 9 and result.cost.flops == 100.0 + 90
