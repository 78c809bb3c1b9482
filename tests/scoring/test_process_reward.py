"""Process rewards and prefix values: step splitting, aggregation, the step verifier, the value
head read per step on the real model."""

import pytest
import torch

from metagen.decoding import Generator
from metagen.decoding import capabilities as caps
from metagen.scoring.process_reward import (
    ArithmeticStepVerifier, FunctionValue, HeadValue, StepRewardValue, ValueHeadPRM, aggregate, split_steps)
from metagen.scoring.step_equations import find_equations


def test_split_steps_keeps_delimiters_and_drops_empty_pieces():
    assert split_steps("a = 1\nb = 2\n\nc", "\n") == ["a = 1\n", "b = 2\n", "c"]
    assert split_steps("", "\n") == []
    with pytest.raises(ValueError, match="delimiter is empty"):
        split_steps("x", "")


def test_aggregate_by_hand():
    scores = [0.9, 0.5, 0.8]
    assert aggregate(scores, "last") == 0.8
    assert aggregate(scores, "min") == 0.5
    assert aggregate(scores, "prod") == pytest.approx(0.36)
    assert aggregate(scores, "mean") == pytest.approx(2.2 / 3)
    assert aggregate([], "min") == 1.0
    with pytest.raises(ValueError, match="aggregate='max'"):
        aggregate(scores, "max")


def test_equations_are_checked_exactly():
    found = find_equations("So 3 + 4 = 7, then 7 x 6 = 42 and 42 / 4 = 10.5 but 10 - 3 = 6.")
    assert [(left, right, holds) for left, right, holds in found] == [
        ("3 + 4", "7", True), ("7 x 6", "42", True), ("42 / 4", "10.5", True), ("10 - 3", "6", False)]
    assert find_equations("Tom has 5 apples.") == []
    assert find_equations("(2 + 3) × 4 = 20")[0][2] is True
    assert find_equations("5 ÷ 0 = 1")[0][2] is False


def test_step_verifier_scores_each_step():
    verifier = ArithmeticStepVerifier(neutral=0.5)
    scored = verifier.score_steps("q", ["Tom has 3 + 4 = 7 apples.\n", "He eats 2: 7 - 2 = 4.\n", "So the answer is 4."])
    assert scored.values == [1.0, 0.0, 0.5]
    assert scored.cost.flops == 0
    with pytest.raises(ValueError, match="neutral=2"):
        ArithmeticStepVerifier(neutral=2)


class Letters:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_step_reward_value_decodes_splits_and_aggregates():
    verifier = ArithmeticStepVerifier()
    value = StepRewardValue(verifier, Letters(), "question", "\n", how="min")
    texts = ["1 + 1 = 2\n2 + 2 = 4", "1 + 1 = 2\n2 + 2 = 5", "no maths"]
    scored = value.values([], [[ord(ch) for ch in text] for text in texts])
    assert scored.values == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="aggregate='sum'"):
        StepRewardValue(verifier, Letters(), "q", "\n", how="sum")


def test_function_value_passes_prompt_and_continuation():
    value = FunctionValue(lambda prompt, continuation: len(prompt) + 10 * len(continuation))
    assert value.values([1, 2], [[3], [4, 5]]).values == [12.0, 22.0]


def test_value_head_prm_reads_the_head_at_each_step_end(model, random_head):
    head = random_head(model)
    prm = ValueHeadPRM(model, head, chat=False)
    steps = ["Tom has 3 apples.\n", "He buys 4 more, 3 + 4 = 7.\n", "The answer is 7."]
    scored = prm.score_steps("How many apples?", steps)
    assert len(scored.values) == 3 and scored.cost.scorer_flops == scored.cost.flops > 0
    # reference: one forward per step prefix, the value at its last token
    prompt_ids = model.tokenizer.encode("How many apples?", add_special_tokens=True)
    for k in range(1, 4):
        ids = prompt_ids + model.tokenizer.encode("".join(steps[:k]), add_special_tokens=False)
        out = model.forward(model.new_cache(1), torch.tensor([ids]), logits="last", hidden=True)
        reference = HeadValue(head).values(prompt_ids, [ids], out.hidden).values[0]
        assert scored.values[k - 1] == pytest.approx(reference, abs=2e-3)


class ScriptedJudge(Generator):
    """A generator whose first-token logprobs say Yes when the judged step's equation holds."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.TOP_LOGPROBS})

    def __init__(self):
        self.prompts = []

    def decode(self, ids):
        return {1: "Yes", 2: "No"}[ids[0]]

    def generate(self, prompt, params, generator=None):
        import math

        from metagen.decoding.cost import Cost
        from metagen.decoding.result import Completion, GenerationResult

        self.prompts.append(prompt)
        step = prompt.split("Next step: ")[1].split("\n")[0]
        good = all(holds for _, _, holds in find_equations(step))
        top = {1: math.log(0.8), 2: math.log(0.2)} if good else {1: math.log(0.1), 2: math.log(0.6)}
        return GenerationResult([Completion(token_ids=[1], top_logprobs=[top])], [0], cost=Cost(model_calls=1, flops=10.0))


def test_judge_prm_asks_one_question_per_step_with_the_previous_steps():
    from metagen.scoring.judge_prm import JudgePRM

    judge = ScriptedJudge()
    scored = JudgePRM(judge).score_steps("Q?", ["3 + 4 = 7.\n", "7 - 2 = 4.\n"])
    assert scored.values == pytest.approx([0.8, 0.1 / 0.7])
    assert scored.cost.model_calls == 2 and scored.cost.scorer_flops == 20.0
    assert "Solution so far:\n(none)" in judge.prompts[0]
    assert "Solution so far:\n3 + 4 = 7." in judge.prompts[1] and "Next step: 7 - 2 = 4." in judge.prompts[1]
    with pytest.raises(ValueError, match="lacks the field {previous}"):
        JudgePRM(judge, template="{question} {step}")


def test_judge_prm_runs_on_the_model(model):
    from metagen.decoding import LocalGenerator
    from metagen.scoring.judge_prm import JudgePRM

    scored = JudgePRM(LocalGenerator(model)).score_steps("What is 3 + 4?", ["3 + 4 = 7.\n", "The answer is 7."])
    assert len(scored.values) == 2 and all(0.0 <= v <= 1.0 for v in scored.values)
    assert scored.cost.model_calls == 2 and scored.cost.scorer_flops > 0
