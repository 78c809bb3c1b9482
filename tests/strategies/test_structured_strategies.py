"""Strategies under a constraint: outputs cut before the constraint accepted them (complete=False)
are never chosen while a complete one exists, and the result says which were set aside; the
capability contract refuses a generator that cannot honour a constraint before any request;
self-refine constrains its answers but not its critiques; self-consistency over a JSON field."""

from __future__ import annotations

import json

import pytest
import torch

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring.utilities import EditSimilarity
from metagen.scoring.logprob import mean_logprob
from metagen.strategies.best_of_n import BestOfNConfig, best_of_n
from metagen.strategies.mbr import MBRConfig, mbr
from metagen.strategies.registry import STRATEGIES, StrategyOptions, get_strategy
from metagen.strategies.self_consistency import SelfConsistencyConfig, self_consistency
from metagen.strategies.self_refine import SelfRefineConfig, self_refine
from metagen.strategies.weighted_voting import WeightedVotingConfig, weighted_voting

pytest.importorskip("llguidance")

CONSTRAINED = SamplingParams(temperature=1.0, max_tokens=32, structured_outputs={"json_object": True})


class Canned(Generator):
    """Returns `outputs` (text, complete) as the completions of every call; records the params."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS, caps.STRUCTURED_OUTPUT})

    def __init__(self, outputs, capabilities=None):
        self.outputs = list(outputs)
        self.params: list[SamplingParams] = []
        if capabilities is not None:
            self.capabilities = frozenset(capabilities)

    def generate(self, prompt, params, *, generator=None):
        self.params.append(params)
        picked = (self.outputs * params.n)[: params.n] if params.n > len(self.outputs) else self.outputs[: params.n]
        completions = [Completion(text, [1] * len(text), [logprob] * len(text),
                                  finish_reason="stop" if complete else "length", complete=complete)
                       for text, complete, logprob in picked]
        return GenerationResult(completions, [0], cost=Cost(model_calls=1))


# The cut outputs have the best log-probabilities and the most common answer.
OUTPUTS = [('{"answer": "7", "why": "', False, -0.01), ('{"answer": "7", "why": "', False, -0.01),
           ('{"answer": "7", "why": "', False, -0.01), ('{"answer": "5"}', True, -1.0),
           ('{"answer": "5"}', True, -1.2), ('{"answer": "6"}', True, -0.5)]


def test_best_of_n_never_picks_a_cut_output_over_a_complete_one():
    from metagen.scoring.logprob import mean_logprob

    result = best_of_n(Canned(OUTPUTS), "q", BestOfNConfig(6, CONSTRAINED), mean_logprob)
    assert result.chosen.text == '{"answer": "6"}' and result.chosen.complete is True
    assert result.incomplete == [0, 1, 2]
    assert max(result.completions, key=lambda c: c.score).complete is False  # it would have won on score


def test_when_every_output_was_cut_the_chosen_one_says_so():
    cut = [(text, False, logprob) for text, _, logprob in OUTPUTS]
    result = best_of_n(Canned(cut), "q", BestOfNConfig(6, CONSTRAINED), mean_logprob)
    assert result.chosen.complete is False and result.incomplete == list(range(6))


def test_self_consistency_over_a_json_field_ignores_cut_outputs():
    config = SelfConsistencyConfig(6, CONSTRAINED, answer_field="answer")
    result = self_consistency(Canned(OUTPUTS), "q", config)
    assert [c.answer for c in result.completions] == [None, None, None, "5", "5", "6"]  # cut JSON does not parse
    assert result.votes == {"5": 2.0, "6": 1.0} and result.answer == "5" and result.chosen.complete
    # a cut output whose field parses anyway still does not vote while complete ones exist
    parsable = [('{"answer": "7"', False, 0.0)] * 3 + OUTPUTS[3:]
    result = self_consistency(Canned(parsable), "q", SelfConsistencyConfig(6, CONSTRAINED, pattern=r'"answer": "(\d)"'))
    assert result.votes == {"5": 2.0, "6": 1.0} and result.answer == "5"


def test_weighted_voting_and_mbr_choose_complete_outputs():
    from metagen.scoring.logprob import mean_logprob

    voted = weighted_voting(Canned(OUTPUTS), "q", WeightedVotingConfig(6, CONSTRAINED, answer_field="answer"),
                            mean_logprob)
    assert voted.chosen.complete is True and "7" not in voted.votes
    chosen = mbr(Canned(OUTPUTS), "q", MBRConfig(6, CONSTRAINED), EditSimilarity())
    # the three identical cut outputs agree most with each other, but only complete ones may win
    assert max(chosen.completions, key=lambda c: c.score).complete is False
    assert chosen.chosen.complete is True


def test_the_registry_passes_answer_field_and_reports_it_per_candidate():
    options = StrategyOptions(math=False, answer_field="answer")
    result = get_strategy("self_consistency").run(Canned(OUTPUTS), "q", 6, CONSTRAINED, options, None)
    assert result.answer == "5"
    result = get_strategy("best_of_n_logprob").run(Canned(OUTPUTS), "q", 6, CONSTRAINED, options, None)
    assert result.answer == "6" and result.chosen.complete
    with pytest.raises(ValueError, match="pattern='x' and answer_field='answer' both say where the answer is"):
        StrategyOptions(pattern="x", answer_field="answer")


def test_a_generator_that_cannot_honour_a_constraint_is_refused_before_any_request():
    plain = Canned(OUTPUTS, capabilities={caps.TOKEN_IDS, caps.LOGPROBS, caps.FULL_DISTRIBUTIONS})
    for name in ("greedy", "best_of_n", "self_consistency", "mbr_edit", "self_refine"):
        with pytest.raises(ValueError, match=f"strategy '{name}' needs structured_output, which Canned does not"):
            get_strategy(name).run(plain, "q", 2, CONSTRAINED, StrategyOptions(), None)
    assert plain.params == []
    get_strategy("self_consistency").run(plain, "q", 2, SamplingParams(), StrategyOptions(), None)  # no constraint


def test_chains_refuse_a_constraint_by_name():
    full = Canned(OUTPUTS, capabilities=caps.ALL)
    for name in ("chain_of_thought", "s2a", "self_ask", "calculator"):
        with pytest.raises(ValueError, match=f"strategy '{name}' cannot honour structured_outputs"):
            get_strategy(name).run(full, "q", 1, CONSTRAINED, StrategyOptions(), None)
        assert not STRATEGIES[name].supported_by(full, StrategyOptions(), CONSTRAINED)
    assert full.params == []


def test_local_generator_honours_the_contract():
    from metagen.decoding import LocalGenerator
    from tests.decoding.toy_model import ToyModel

    assert get_strategy("best_of_n").supported_by(LocalGenerator(ToyModel()), StrategyOptions(), CONSTRAINED)


def test_self_refine_constrains_answers_but_not_critiques():
    draft, critique, revision = ('{"answer": "5"}', True, -1.0), ("The answer is wrong.", None, -1.0), \
        ('{"answer": "6"}', True, -1.0)

    class Script(Canned):
        def generate(self, prompt, params, *, generator=None):
            self.outputs = [[draft], [critique], [revision]][len(self.params)]
            return super().generate(prompt, params, generator=generator)

    generator = Script([])
    result = get_strategy("self_refine").run(generator, "q", 2, CONSTRAINED, StrategyOptions(), None)
    kinds = [None if p.structured_outputs is None else p.structured_outputs.kind for p in generator.params]
    assert kinds == ["json_object", None, "json_object"]  # draft, critique, revision
    assert result.text == '{"answer": "6"}' and result.critiques == ["The answer is wrong."]


def test_self_refine_returns_the_latest_complete_version():
    script = [[('{"answer": "5"}', True, -1.0)], [("Wrong.", None, -1.0)], [('{"answer": "6", "x', False, -1.0)]]

    class Script(Canned):
        def generate(self, prompt, params, *, generator=None):
            self.outputs = script[len(self.params)]
            return super().generate(prompt, params, generator=generator)

    config = SelfRefineConfig(rounds=1, draft_params=CONSTRAINED, revision_params=CONSTRAINED)
    result = self_refine(Script([]), "q", config)
    assert result.text == '{"answer": "5"}' and result.incomplete == [1]


@pytest.mark.slow
def test_self_consistency_over_a_json_field_on_the_real_model(model):
    jsonschema = pytest.importorskip("jsonschema")
    from metagen.decoding import LocalGenerator

    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 20}},
              "required": ["answer"], "additionalProperties": False}
    params = SamplingParams(temperature=1.0, max_tokens=24, structured_outputs={"json": schema})
    result = get_strategy("self_consistency").run(
        LocalGenerator(model), "What is 2 + 3? Reply as JSON with the field answer.", 6, params,
        StrategyOptions(answer_field="answer"), torch.Generator().manual_seed(0))
    complete = [c for c in result.completions if c.complete]
    assert complete and result.chosen.complete
    for candidate in complete:
        document = json.loads(candidate.text)
        jsonschema.validate(document, schema)
        assert candidate.answer == str(document["answer"])
    assert sum(result.votes.values()) == len(complete)


def test_strategies_called_directly_refuse_a_generator_that_would_ignore_the_constraint():
    plain = Canned(OUTPUTS, capabilities={caps.TOKEN_IDS, caps.LOGPROBS})
    calls = [
        lambda: best_of_n(plain, "q", BestOfNConfig(2, CONSTRAINED)),
        lambda: self_consistency(plain, "q", SelfConsistencyConfig(2, CONSTRAINED)),
        lambda: weighted_voting(plain, "q", WeightedVotingConfig(2, CONSTRAINED)),
        lambda: mbr(plain, "q", MBRConfig(2, CONSTRAINED), EditSimilarity()),
        lambda: self_refine(plain, "q", SelfRefineConfig(rounds=1, revision_params=CONSTRAINED)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="needs structured_output, which Canned does not provide"):
            call()
    assert plain.params == []
