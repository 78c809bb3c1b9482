"""In-context navigation: exact rounds, prompts and stopping with a generator whose answer depends
on the answers listed in its prompt; summed costs; every round recorded; the selection rules;
capability refusals before any request; and, on the real model, the likelihood scorer against a
plain forward and span-constrained navigation."""

import pytest

from metagen.decoding import capabilities as caps
from metagen.decoding import Cost, Generator
from metagen.decoding.result import Completion, GenerationResult
from metagen.sampling import SamplingParams
from metagen.scoring import Scorer, Scores
from metagen.strategies.in_context_navigation import (
    TEMPLATE,
    InContextNavigationConfig,
    answer_key,
    in_context_navigation,
    listing,
)
from metagen.strategies.registry import get_strategy
from metagen.strategies.spec import StrategyOptions

QUESTION = "Name a city in France."


class Navigator(Generator):
    """Replies with the first of `ranked` not listed ("- answer" lines) in the prompt's last
    message, case-insensitively; when all are listed, with `exhausted` (default: ranked[0]).
    Call i costs one model call, 10 + i prompt tokens, 2 generated tokens and 100·(i + 1) FLOPs."""

    capabilities = frozenset({caps.TOKEN_IDS})

    def __init__(self, ranked, exhausted=None):
        self.ranked, self.exhausted = ranked, exhausted if exhausted is not None else ranked[0]
        self.prompts, self.costs = [], []

    def generate(self, prompt, params, *, generator=None):
        assert params.n == 1
        index = len(self.prompts)
        self.prompts.append(prompt)
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        listed = {line[2:].casefold() for line in text.splitlines() if line.startswith("- ")}
        reply = next((answer for answer in self.ranked if answer.casefold() not in listed), self.exhausted)
        cost = Cost(model_calls=1, prompt_tokens_computed=10 + index, generated_tokens=2, flops=100.0 * (index + 1))
        self.costs.append(cost)
        return GenerationResult([Completion(text=reply, token_ids=[1, 2])], [0] * (10 + index), cost=cost)

    def total(self):
        total = Cost()
        for cost in self.costs:
            total += cost
        return total


class TableScorer(Scorer):
    """Scores by text (default 0); records what it was asked; each call costs 1000 model calls."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def score(self, prompt, candidates):
        self.asked.append([c.text for c in candidates])
        return Scores([self.values.get(c.text, 0.0) for c in candidates], Cost(model_calls=1000))


def request(explored):
    return [{"role": "user", "content": TEMPLATE.format(question=QUESTION, explored=listing(explored))}]


def test_each_round_lists_the_answers_explored_and_every_reply_is_a_candidate():
    generator = Navigator(["Paris", "Lyon", "Nice", "Lille", "Lens"])
    result = in_context_navigation(generator, QUESTION, InContextNavigationConfig(rounds=4))
    assert [c.text for c in result.completions] == ["Paris", "Lyon", "Nice", "Lille"]
    assert generator.prompts == [QUESTION, request(["Paris"]), request(["Paris", "Lyon"]),
                                 request(["Paris", "Lyon", "Nice"])]
    assert generator.prompts[2][0]["content"].endswith(
        "Answers already proposed:\n- Paris\n- Lyon\n\nGive a different answer, one that is not in the list above. "
        "Reply with the answer only.")
    assert result.explored == ["Paris", "Lyon", "Nice", "Lille"] and not result.repeated
    assert result.cost == generator.total() and result.cost.model_calls == 4 and result.cost.flops == 1000.0
    assert result.chosen.text == "Paris"  # selection "first"


def test_a_repeat_stops_the_search_and_is_recorded_unless_told_to_go_on():
    generator = Navigator(["Paris", "Lyon"])  # after both, it says Paris again
    result = in_context_navigation(generator, QUESTION, InContextNavigationConfig(rounds=6))
    assert [c.text for c in result.completions] == ["Paris", "Lyon", "Paris"]
    assert result.repeated and result.explored == ["Paris", "Lyon"] and len(generator.prompts) == 3
    assert result.cost == generator.total()
    going_on = Navigator(["Paris", "Lyon"])
    result = in_context_navigation(going_on, QUESTION, InContextNavigationConfig(rounds=6, stop_on_repeat=False))
    assert len(result.completions) == len(going_on.prompts) == 6 and not result.repeated
    assert going_on.prompts[-1] == request(["Paris", "Lyon"])  # a repeat is not listed twice


def test_answers_are_compared_after_case_whitespace_and_trailing_punctuation():
    assert answer_key("  Paris.\n") == answer_key("paris") == "paris" and answer_key("New  York!") == "new york"
    generator = Navigator(["Paris"], exhausted=" PARIS. ")
    result = in_context_navigation(generator, QUESTION, InContextNavigationConfig(rounds=5))
    assert len(result.completions) == 2 and result.repeated
    empty = Navigator(["Paris"], exhausted="  ")  # an empty reply proposes nothing new: it stops too
    assert in_context_navigation(empty, QUESTION, InContextNavigationConfig(rounds=5)).repeated


def test_selection_rules():
    def run(selection, scorer=None):
        return in_context_navigation(Navigator(["Paris", "Lyon", "Nice"]), QUESTION,
                                     InContextNavigationConfig(rounds=5, selection=selection), scorer)

    assert run("first").chosen.text == "Paris"
    assert run("last").chosen.text == "Nice"  # the last new answer, not the repeat after it
    scorer = TableScorer({"Lyon": 2.0, "Nice": 1.0})
    result = run("scorer", scorer)
    assert result.chosen.text == "Lyon" and scorer.asked == [["Paris", "Lyon", "Nice"]]  # distinct answers only
    assert result.cost.model_calls == 4 + 1000  # 4 rounds (the 4th repeats) + the scorer's call
    assert [c.score for c in result.completions] == [0.0, 2.0, 1.0, 0.0]  # the repeat shares Paris' score


def test_explore_the_extracted_answer_of_replies_that_reason():
    class Reasoner(Navigator):
        def generate(self, prompt, params, *, generator=None):
            result = super().generate(prompt, params, generator=generator)
            result.completions[0].text = f"Let me think. The answer is {result.completions[0].text}"
            return result

    generator = Reasoner(["12", "15"])
    config = InContextNavigationConfig(rounds=3, explore="answer", pattern=r"answer is (\w+)")
    result = in_context_navigation(generator, QUESTION, config)
    assert result.explored == ["12", "15"] and len(result.completions) == 3 and result.repeated
    assert generator.prompts[1] == request(["12"])


def test_a_chat_prompt_keeps_its_context_and_token_ids_are_refused():
    generator = Navigator(["Paris", "Lyon"])
    system = {"role": "system", "content": "Be brief."}
    in_context_navigation(generator, [system, {"role": "user", "content": QUESTION}],
                          InContextNavigationConfig(rounds=2))
    assert generator.prompts[1] == [system, *request(["Paris"])]
    with pytest.raises(ValueError, match="not token ids"):
        in_context_navigation(Navigator(["Paris"]), [1, 2, 3], InContextNavigationConfig(rounds=2))


def test_config_checks_name_the_option():
    with pytest.raises(ValueError, match="request_template.*missing fields \\['explored'\\]"):
        InContextNavigationConfig(request_template="{question} again")
    with pytest.raises(ValueError, match="rounds=0 is out of range"):
        InContextNavigationConfig(rounds=0)
    with pytest.raises(ValueError, match="selection='best' is not known; choose from first, last, likelihood"):
        InContextNavigationConfig(selection="best")
    with pytest.raises(ValueError, match="two constraints"):
        InContextNavigationConfig(passage="text", params=SamplingParams(structured_outputs={"regex": "a"}))


def test_what_the_options_need_is_refused_before_any_request():
    generator = Navigator(["Paris"])
    for config in (InContextNavigationConfig(selection="likelihood"), InContextNavigationConfig(passage="Paris")):
        with pytest.raises(ValueError, match="needs local_cache"):
            in_context_navigation(generator, QUESTION, config)
    with pytest.raises(ValueError, match="selection='scorer' needs a scorer"):
        in_context_navigation(generator, QUESTION, InContextNavigationConfig(selection="scorer"))
    with pytest.raises(ValueError, match="a scorer is read by selection='scorer' only; selection is 'first'"):
        in_context_navigation(generator, QUESTION, InContextNavigationConfig(), TableScorer({}))
    spec = get_strategy("in_context_navigation")
    options = StrategyOptions()
    assert spec.required(options) == frozenset()
    assert spec.required(options, None, {"selection": "likelihood"}) == {caps.LOCAL_CACHE}
    assert spec.required(options, None, {"passage": "Paris"}) == {caps.LOCAL_CACHE}
    assert not spec.supported_by(generator, options, None, {"passage": "Paris"})
    with pytest.raises(ValueError, match="strategy 'in_context_navigation' needs local_cache"):
        spec.run(generator, QUESTION, 3, SamplingParams(temperature=0), options, None, {"selection": "likelihood"})
    assert generator.prompts == []


def test_the_registry_entry_runs_n_rounds_and_parses_its_options():
    spec = get_strategy("in_context_navigation")
    n, options, overrides = spec.parse({"n": 3, "selection": "last", "stop_on_repeat": False})
    generator = Navigator(["Paris", "Lyon", "Nice", "Lille"])
    result = spec.run(generator, QUESTION, n, SamplingParams(temperature=0, max_tokens=8), options, None, overrides)
    assert [c.text for c in result.completions] == ["Paris", "Lyon", "Nice"] and result.chosen.text == "Nice"
    assert [c.answer for c in result.completions] == [None, None, None]  # default extraction finds no number
    with pytest.raises(ValueError, match="explore='words' is not known"):
        spec.parse({"explore": "words"})


@pytest.mark.slow
def test_likelihood_scores_equal_a_plain_forward_of_prompt_and_answer(model_fp32):
    import torch

    from metagen.decoding import LocalGenerator
    from metagen.decoding.prompts import encode_prompt
    from metagen.scoring.likelihood import AnswerLikelihood

    generator = LocalGenerator(model_fp32)
    candidates = [Completion(text="Paris"), Completion(text="The capital is Lyon."), Completion(text="")]
    scores = AnswerLikelihood(generator)("What is the capital of France?", candidates)
    prompt_ids = encode_prompt(model_fp32.tokenizer, "What is the capital of France?", None)
    for candidate, value in zip(candidates[:2], scores.values):
        ids = model_fp32.tokenizer.encode(candidate.text, add_special_tokens=False)
        with torch.no_grad():
            logits = model_fp32.forward(model_fp32.new_cache(1), [prompt_ids + ids], logits="all").logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)[len(prompt_ids) - 1:-1]  # (|y|, V)
        assert value == pytest.approx(float(logprobs[torch.arange(len(ids)), torch.tensor(ids)].sum()), abs=1e-3)
    assert scores.values[2] == 0.0 and scores.cost.model_calls == 2
    assert scores.cost.prompt_tokens_computed == len(prompt_ids) + sum(
        len(model_fp32.tokenizer.encode(c.text, add_special_tokens=False)) for c in candidates)


@pytest.mark.slow
def test_extractive_navigation_on_the_real_model_stays_inside_the_passage(model):
    from metagen.decoding import LocalGenerator

    passage = ("Marie Curie was born in Warsaw in 1867. She moved to Paris in 1891, studied physics at the "
               "Sorbonne, and shared the 1903 Nobel Prize in Physics with Pierre Curie and Henri Becquerel.")
    generator = LocalGenerator(model)
    config = InContextNavigationConfig(rounds=3, passage=passage, selection="likelihood", stop_on_repeat=False,
                                       params=SamplingParams(temperature=0, max_tokens=16))
    result = in_context_navigation(generator, f"{passage}\n\nWho shared the Nobel Prize with Marie Curie?", config)
    assert len(result.completions) == 3
    for reply in result.completions:
        assert reply.text and reply.text in passage
    assert result.chosen in result.completions and result.chosen.score is not None
    rounds = sum(c.finish_reason is not None for c in result.completions)
    assert rounds == 3 and result.cost.model_calls > 3 + 2  # every decoding forward plus the scorer's two
