"""Self-refine and verifier-feedback refinement: exact control flow with a scripted generator
(the prompts it is sent, when the loop stops, which candidate is revised and returned, summed
costs), config validation, and end-to-end runs on the real model."""

import pytest

from metagen.decoding import capabilities as caps
from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring import ExactAnswerVerifier, Scorer, Scores, Verdict, Verifier, mean_logprob
from metagen.strategies.self_refine import (
    CRITIQUE_TEMPLATE,
    REVISION_TEMPLATE,
    SelfRefineConfig,
    self_refine,
)
from metagen.strategies.verifier_refine import REVISION_TEMPLATE as FEEDBACK_TEMPLATE
from metagen.strategies.verifier_refine import VerifierRefineConfig, verifier_refine


class ScriptedGenerator(Generator):
    """Answers call i with script[i]: a text or a list of texts, each text optionally paired with
    its per-token logprobs (default: -1 per word). Records every prompt and params. Call i costs
    one model call, 10 + i prompt tokens, its generated tokens and 100·(i + 1) FLOPs; `total_cost`
    sums what was spent."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS})

    def __init__(self, script):
        self.script = list(script)
        self.prompts = []
        self.params = []
        self.costs = []

    def generate(self, prompt, params, *, generator=None):
        index = len(self.prompts)
        self.prompts.append(prompt)
        self.params.append(params)
        outputs = self.script[index]  # IndexError: the strategy made a call the script did not expect
        outputs = [outputs] if isinstance(outputs, (str, tuple)) else outputs
        assert params.n == len(outputs)
        completions = []
        for output in outputs:
            text, logprobs = output if isinstance(output, tuple) else (output, [-1.0] * len(output.split()))
            completions.append(Completion(text=text, token_ids=list(range(len(logprobs))), logprobs=list(logprobs)))
        generated = sum(len(c.token_ids) for c in completions)
        cost = Cost(model_calls=1, prompt_tokens_computed=10 + index, generated_tokens=generated,
                    flops=100.0 * (index + 1))
        self.costs.append(cost)
        return GenerationResult(completions, [0] * (10 + index), cost=cost)

    def total_cost(self):
        total = Cost()
        for cost in self.costs:
            total += cost
        return total


class TableVerifier(Verifier):
    """Verdicts by candidate text: table[text] = (passed, score), else (False, 0.0); feedback
    "feedback on <text>"; each verification costs 7 model calls."""

    def __init__(self, table=None):
        self.table = table or {}
        self.checked = []

    def verify(self, prompt, candidate):
        self.checked.append((prompt, candidate.text))
        passed, score = self.table.get(candidate.text, (False, 0.0))
        return Verdict(passed, score, f"feedback on {candidate.text}", Cost(model_calls=7))


class TableScorer(Scorer):
    """Scores by candidate text (default 0); each call costs 1000 model calls."""

    def __init__(self, values):
        self.values = values

    def score(self, prompt, candidates):
        return Scores([self.values.get(c.text, 0.0) for c in candidates], Cost(model_calls=1000))


def user(content):
    return [{"role": "user", "content": content}]


# ---------------------------------------------------------------- self-refine

STAGES = dict(draft_params=SamplingParams(temperature=0.5, n=3), critique_params=SamplingParams(temperature=0.0),
              revision_params=SamplingParams(temperature=0.9))


def test_self_refine_stops_when_the_critique_says_the_stop_phrase():
    script = ["x is 3", "Step 2 is wrong: 2 + 2 is 4.", "x is 4", "Checked again. NO ERRORS"]
    generator = ScriptedGenerator(script)
    result = self_refine(generator, "Solve for x.", SelfRefineConfig(rounds=5, **STAGES))
    assert [c.text for c in result.completions] == ["x is 3", "x is 4"]
    assert result.critiques == [script[1], script[3]]
    assert result.stopped and result.rounds == 1 and result.text == "x is 4"
    assert generator.prompts == [
        "Solve for x.",
        user(CRITIQUE_TEMPLATE.format(question="Solve for x.", answer="x is 3", stop_phrase="NO ERRORS")),
        user(REVISION_TEMPLATE.format(question="Solve for x.", answer="x is 3", critique=script[1])),
        user(CRITIQUE_TEMPLATE.format(question="Solve for x.", answer="x is 4", stop_phrase="NO ERRORS")),
    ]
    assert "Step 2 is wrong: 2 + 2 is 4." in generator.prompts[2][0]["content"]
    stage_temperatures = [p.temperature for p in generator.params]
    assert stage_temperatures == [0.5, 0.0, 0.9, 0.0] and all(p.n == 1 for p in generator.params)
    assert all(c.score is None for c in result.completions)
    assert result.cost == generator.total_cost()


def test_self_refine_runs_exactly_rounds_when_never_accepted():
    # "no errors" in lower case is not the stop phrase (the match is case-sensitive)
    script = ["v0", "there are no errors in step 1, step 2 is off", "v1", "still wrong", "v2"]
    generator = ScriptedGenerator(script)  # a sixth call would raise IndexError
    result = self_refine(generator, "q", SelfRefineConfig(rounds=2))
    assert [c.text for c in result.completions] == ["v0", "v1", "v2"]
    assert result.critiques == [script[1], script[3]]
    assert not result.stopped and result.rounds == 2 and result.text == "v2"
    assert len(generator.prompts) == 5
    assert result.cost == generator.total_cost()


def test_self_refine_with_zero_rounds_returns_the_draft():
    generator = ScriptedGenerator(["only"])
    result = self_refine(generator, "q", SelfRefineConfig(rounds=0))
    assert result.text == "only" and result.critiques == [] and result.rounds == 0 and not result.stopped


def test_self_refine_scorer_chooses_among_all_versions_and_is_paid_for():
    script = ["v0", "bad", "v1", "bad", "v2"]
    earlier = self_refine(ScriptedGenerator(script), "q", SelfRefineConfig(rounds=2),
                          scorer=TableScorer({"v0": 2.0, "v1": 1.0, "v2": 0.0}))
    assert earlier.text == "v0" and [c.score for c in earlier.completions] == [2.0, 1.0, 0.0]
    tied = self_refine(ScriptedGenerator(script), "q", SelfRefineConfig(rounds=2),
                       scorer=TableScorer({"v0": 0.5, "v1": 0.9, "v2": 0.9}))
    assert tied.chosen is tied.completions[2]  # ties go to the later version
    generator = ScriptedGenerator(script)
    paid = self_refine(generator, "q", SelfRefineConfig(rounds=2), scorer=TableScorer({}))
    assert paid.cost == generator.total_cost() + Cost(model_calls=1000)  # one scorer call for all versions


def test_self_refine_keeps_the_chat_context_and_rejects_token_ids():
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
              {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    generator = ScriptedGenerator(["a", "NO ERRORS"])
    result = self_refine(generator, prompt, SelfRefineConfig(rounds=1))
    assert result.stopped and result.text == "a"
    assert generator.prompts[0] == prompt
    assert generator.prompts[1] == prompt[:3] + user(
        CRITIQUE_TEMPLATE.format(question="Q2", answer="a", stop_phrase="NO ERRORS"))
    with pytest.raises(ValueError, match="token ids"):
        self_refine(ScriptedGenerator([]), [1, 2, 3])
    with pytest.raises(ValueError, match="user turn"):
        self_refine(ScriptedGenerator([]), [{"role": "system", "content": "hi"}])


@pytest.mark.parametrize("fields, message", [
    (dict(rounds=-1), "rounds=-1 is out of range"),
    (dict(rounds=True), "rounds=True must be an int"),
    (dict(stop_phrase=" "), "stop_phrase=' '"),
    (dict(critique_params={"temperature": 0}), "critique_params="),
    (dict(critique_template="{question}"), r"critique_template=.*missing fields \['answer'\]"),
    (dict(revision_template="{answer} {critique} {tests}"), r"unknown fields \['tests'\]"),
    (dict(revision_template="{answer} {critique"), "not a valid format template"),
])
def test_self_refine_config_names_the_bad_field(fields, message):
    with pytest.raises(ValueError, match=message):
        SelfRefineConfig(**fields)


# ---------------------------------------------------------------- verifier refinement

def test_verifier_refine_returns_at_round_zero_when_a_candidate_passes():
    generator = ScriptedGenerator([["a", "b", "c"]])
    verifier = TableVerifier({"b": (True, 1.0)})
    result = verifier_refine(generator, "q", verifier, VerifierRefineConfig(initial_candidates=3, rounds=4))
    assert result.text == "b" and result.passed and result.rounds == 0
    assert [c.score for c in result.completions] == [0.0, 1.0, 0.0]
    assert result.parents == [None] * 3 and len(generator.prompts) == 1 and generator.params[0].n == 3
    assert [prompt for prompt, _ in verifier.checked] == ["q"] * 3


def test_verifier_refine_revises_the_best_with_its_feedback_and_keeps_the_best_revision():
    generator = ScriptedGenerator([["a", "b"], ["r1", "r2", "r3"]])
    verifier = TableVerifier({"a": (False, 0.2), "b": (False, 0.5), "r1": (False, 0.3), "r2": (False, 0.8),
                              "r3": (False, 0.6)})
    config = VerifierRefineConfig(initial_candidates=2, rounds=1, revisions_per_round=3)
    result = verifier_refine(generator, "Add them.", verifier, config)
    assert generator.prompts[1] == user(FEEDBACK_TEMPLATE.format(question="Add them.", answer="b",
                                                                 feedback="feedback on b"))
    assert generator.params[1].n == 3
    assert result.text == "r2" and not result.passed and result.rounds == 1
    assert result.parents == [None, None, 1, 1, 1]
    assert [c.score for c in result.completions] == [0.2, 0.5, 0.3, 0.8, 0.6]
    assert [prompt for prompt, _ in verifier.checked] == ["Add them."] * 5  # always the original question


def test_verifier_refine_keeps_the_best_so_far_and_stops_when_a_revision_passes():
    script = [["a"], ["b", "c"], ["d", "e"], ["f", "g"]]
    table = {"a": (False, 0.1), "b": (False, 0.4), "c": (False, 0.3), "d": (False, 0.2), "e": (False, 0.35),
             "f": (False, 0.0), "g": (True, 1.0)}
    generator = ScriptedGenerator(script)
    config = VerifierRefineConfig(initial_candidates=1, rounds=5, revisions_per_round=2)
    result = verifier_refine(generator, "q", TableVerifier(table), config)
    # round 1 revises a; round 2 revises b; d and e score below b, so round 3 revises b again
    assert [p[0]["content"].split("Previous attempt:\n")[1].split("\n")[0] for p in generator.prompts[1:]] == \
        ["a", "b", "b"]
    assert result.text == "g" and result.passed and result.rounds == 3
    assert result.parents == [None, 0, 0, 1, 1, 1, 1]


def test_verifier_refine_stops_at_the_budget_and_returns_the_best():
    generator = ScriptedGenerator([["a", "b"], ["c", "d"], ["e", "f"]])  # a fourth call would raise
    table = {"a": (False, 0.5), "d": (False, 0.7), "e": (False, 0.6)}
    config = VerifierRefineConfig(initial_candidates=2, rounds=2, revisions_per_round=2)
    result = verifier_refine(generator, "q", TableVerifier(table), config)
    assert result.rounds == 2 and not result.passed and result.text == "d"
    assert len(result.completions) == 6 and len(result.verdicts) == 6


def test_verifier_refine_ties_go_to_the_scorer_then_to_the_newest():
    # all verifier scores tie at 0: the scorer picks the parent ...
    generator = ScriptedGenerator([["x", "y", "z"], ["r"]])
    config = VerifierRefineConfig(initial_candidates=3, rounds=1, revisions_per_round=1)
    result = verifier_refine(generator, "q", TableVerifier(), config, scorer=TableScorer({"y": 5.0, "r": -1.0}))
    assert "Previous attempt:\ny\n" in generator.prompts[1][0]["content"]
    assert result.tiebreak_scores == [0.0, 5.0, 0.0, -1.0] and result.text == "y"
    # ... and without one the newest candidate is revised: a chain x, y -> r1 -> r2
    generator = ScriptedGenerator([["x", "y"], ["r1"], ["r2"]])
    config = VerifierRefineConfig(initial_candidates=2, rounds=2, revisions_per_round=1)
    result = verifier_refine(generator, "q", TableVerifier(), config)
    assert result.parents == [None, None, 1, 2] and result.text == "r2" and result.tiebreak_scores == []


def test_verifier_refine_beam_revises_several_and_stops_mid_round_on_a_pass():
    table = {"a": (False, 0.1), "b": (False, 0.3), "c": (False, 0.2)}
    config = VerifierRefineConfig(initial_candidates=3, rounds=1, revisions_per_round=1, beam=2)
    generator = ScriptedGenerator([["a", "b", "c"], ["rb"], ["rc"]])
    result = verifier_refine(generator, "q", TableVerifier(table), config)
    assert result.parents == [None, None, None, 1, 2] and len(generator.prompts) == 3
    generator = ScriptedGenerator([["a", "b", "c"], ["rb"]])  # rb passes: c is not revised
    result = verifier_refine(generator, "q", TableVerifier({**table, "rb": (True, 1.0)}), config)
    assert result.text == "rb" and result.passed and len(generator.prompts) == 2


def test_verifier_refine_cost_is_generation_plus_verifier_plus_scorer():
    generator = ScriptedGenerator([[("a", [-1.0, -2.0]), "b c"], ["d", "e f g"], ["h", "i"]])
    config = VerifierRefineConfig(initial_candidates=2, rounds=2, revisions_per_round=2)
    result = verifier_refine(generator, "q", TableVerifier(), config, scorer=TableScorer({}))
    # 3 generate calls, 6 verifications at 7 calls each, 3 scorer calls at 1000 each
    assert result.cost == generator.total_cost() + Cost(model_calls=6 * 7 + 3 * 1000)
    assert result.cost.model_calls == 3 + 42 + 3000 and result.cost.flops == 600.0
    assert result.cost.generated_tokens == sum(len(c.token_ids) for c in result.completions) == 10


@pytest.mark.parametrize("fields, message", [
    (dict(initial_candidates=0), "initial_candidates=0 is out of range"),
    (dict(rounds=-1), "rounds=-1 is out of range"),
    (dict(revisions_per_round=0), "revisions_per_round=0 is out of range"),
    (dict(beam=1.5), "beam=1.5 must be an int"),
    (dict(params=None), "params=None is not a SamplingParams"),
    (dict(revision_template="{answer}"), r"missing fields \['feedback'\]"),
])
def test_verifier_refine_config_names_the_bad_field(fields, message):
    with pytest.raises(ValueError, match=message):
        VerifierRefineConfig(**fields)


# ---------------------------------------------------------------- the real model

QUESTION, REFERENCE = "What is 12 + 9? Answer with a number.", "21"


@pytest.mark.slow
def test_self_refine_on_the_real_model(model):
    from metagen.decoding import LocalGenerator

    params = SamplingParams(temperature=0.7, max_tokens=24, seed=0)
    config = SelfRefineConfig(rounds=1, draft_params=params, critique_params=params, revision_params=params)
    verifier = ExactAnswerVerifier(REFERENCE)
    result = self_refine(LocalGenerator(model), QUESTION, config, scorer=verifier)
    assert len(result.critiques) == 1 and result.stopped == ("NO ERRORS" in result.critiques[0])
    assert len(result.completions) == 1 + result.rounds == (1 if result.stopped else 2)
    assert all(c.score == float(verifier.verify(QUESTION, c).passed) for c in result.completions)
    assert result.chosen.score == max(c.score for c in result.completions)
    # the critique's tokens are paid for but are not a candidate
    assert result.cost.generated_tokens > sum(len(c.token_ids) for c in result.completions)
    assert result.cost.model_calls >= 3 and result.cost.flops > 0


@pytest.mark.slow
def test_verifier_refine_on_the_real_model(model):
    from metagen.decoding import LocalGenerator

    config = VerifierRefineConfig(initial_candidates=2, rounds=1, revisions_per_round=2,
                                  params=SamplingParams(temperature=0.7, max_tokens=24, seed=0))
    verifier = ExactAnswerVerifier(REFERENCE)
    result = verifier_refine(LocalGenerator(model), QUESTION, verifier, config, scorer=mean_logprob)
    expected = 2 if result.rounds == 0 else 4
    assert len(result.completions) == len(result.verdicts) == len(result.tiebreak_scores) == expected
    assert result.rounds == (0 if any(v.passed for v in result.verdicts[:2]) else 1)
    if result.rounds:  # the revisions came from the better first sample (score, then mean logprob)
        parent = max(range(2), key=lambda i: (result.verdicts[i].score, result.tiebreak_scores[i], i))
        assert result.parents == [None, None, parent, parent]
    assert result.passed == verifier.verify(QUESTION, result.chosen).passed
    assert result.passed == any(v.passed for v in result.verdicts)
    assert [c.score for c in result.completions] == [float(v.passed) for v in result.verdicts]
    assert result.cost.generated_tokens == sum(len(c.token_ids) for c in result.completions)
    assert result.cost.prompt_tokens_reused > 0 and result.cost.flops > 0


# ---------------------------------------------------------------- verifier_refine in the registry

CODE_PROMPT = '''def double(x):
    """Twice x.
    >>> double(2)
    4
    >>> double(5)
    10
    """
'''


def reply(body):
    return f"```python\ndef double(x):\n    return {body}\n```"


def test_the_registry_entry_revises_with_the_failing_examples_until_they_pass():
    """The entry's verifier is the prompt's docstring examples: the first attempt (x + 2) passes
    double(2) but not double(5); the revision prompt carries that feedback, and the second attempt
    (2 * x), which passes both, ends the run before the budget of n = 3."""
    from metagen.strategies.registry import get_strategy
    from metagen.strategies.spec import StrategyOptions

    generator = ScriptedGenerator([reply("x + 2"), reply("2 * x"), reply("x")])
    spec = get_strategy("verifier_refine")
    result = spec.run(generator, user(CODE_PROMPT), 3, SamplingParams(temperature=0.8, max_tokens=64),
                      StrategyOptions(), None)
    assert len(generator.prompts) == 2 and result.passed and result.rounds == 1
    assert result.text == reply("2 * x") and result.parents == [None, 0]
    revision = generator.prompts[1][-1]["content"]
    assert "double(5)" in revision and reply("x + 2") in revision
    assert [params.n for params in generator.params] == [1, 1]
    assert result.cost.model_calls == 2 and result.cost.wall_seconds > 0  # the samples plus the sandbox's time


def test_the_registry_entry_without_examples_returns_the_first_sample():
    from metagen.strategies.registry import get_strategy
    from metagen.strategies.spec import StrategyOptions

    generator = ScriptedGenerator([reply("x + x")])
    prompt = user("def double(x):\n    \"\"\"Twice x.\"\"\"\n")
    result = get_strategy("verifier_refine").run(generator, prompt, 4, SamplingParams(max_tokens=64),
                                                 StrategyOptions(), None)
    assert result.text == reply("x + x") and len(generator.prompts) == 1


def test_mbr_judge_is_refused_without_top_logprobs_before_any_request():
    from metagen.strategies.registry import get_strategy
    from metagen.strategies.spec import StrategyOptions

    generator = ScriptedGenerator([])
    with pytest.raises(ValueError, match="mbr_judge.*top_logprobs.*Yes/No token"):
        get_strategy("mbr_judge").run(generator, "Q?", 2, SamplingParams(), StrategyOptions(), None)
    assert generator.prompts == []
