"""Demonstrate-Search-Predict over a real BM25 index of a small corpus, with a toy generator
that answers by the question it is asked about: the exact query of each hop, passages never
repeated across hops, demonstrations kept only from runs whose answer was right, the vote, and a
Cost that counts every model call and every search's time."""

from __future__ import annotations

import json

import pytest

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.retrieval.base import format_passages
from metagen.sampling import SamplingParams
from metagen.strategies.dsp import DONE, DSPConfig, bootstrap, dsp, read_examples, search_predict
from metagen.strategies.registry import get_strategy
from tests.retrieval.corpus import write_corpus

pytest.importorskip("bm25s")

RECORDS = [
    {"id": "t", "text": "The Eiffel Tower in Paris was completed in 1889.", "title": "Eiffel Tower"},
    {"id": "g", "text": "Gustave Eiffel's company designed and built the Eiffel Tower.", "title": "Gustave Eiffel"},
    {"id": "b", "text": "Gustave Eiffel was born in Dijon in 1832.", "title": "Gustave Eiffel"},
    {"id": "s", "text": "The Statue of Liberty was completed in 1886.", "title": "Statue of Liberty"},
    {"id": "r", "text": "Rome is the capital of Italy."},
    {"id": "p", "text": "Paris is the capital of France."},
]
QUESTION = "Where was the builder of the Eiffel Tower born?"


class ToyGenerator(Generator):
    """Answers by the question a request is about (the last "Question:" line of its user message):
    a query call (prefill "Search h:") gets plan[question]["queries"][h - 2], a predict call
    (prefill "Answer:") n answers, going round plan[question]["answers"]. One model call and one token per
    character of each completion; every request is recorded."""

    capabilities = frozenset({caps.ASSISTANT_CONTINUATION})

    def __init__(self, plan):
        self.plan, self.requests = plan, []

    def generate(self, prompt, params, *, generator=None):
        self.requests.append((prompt, params))
        question = prompt[-2]["content"].rsplit("Question: ", 1)[1].split("\n", 1)[0]
        prefill = prompt[-1]["content"]
        if prefill.startswith("Search "):
            hop = int(prefill[len("Search "):-1])
            texts = [" " + self.plan[question]["queries"][hop - 2]]
        else:
            assert prefill == "Answer:"
            answers = self.plan[question]["answers"]
            texts = [" " + answers[index % len(answers)] for index in range(params.n)]
        assert len(texts) == params.n and params.stop == ("\n",)
        completions = [Completion(text, finish_reason="stop", stop_reason="\n") for text in texts]
        cost = Cost(model_calls=1, prompt_tokens_computed=10, generated_tokens=sum(map(len, texts)))
        return GenerationResult(completions, cost=cost)

    def calls(self, prefill):
        return [prompt for prompt, _ in self.requests if prompt[-1]["content"].startswith(prefill)]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    return write_corpus(tmp_path, monkeypatch, RECORDS)


@pytest.fixture
def retriever(corpus):
    from metagen.retrieval import BM25Retriever

    return BM25Retriever(corpus)


def config(corpus, **fields):
    return DSPConfig(params=SamplingParams(temperature=0.7, max_tokens=64), retriever=f"bm25:{corpus}", passages=2,
                     **fields)


def test_each_hop_searches_its_query_and_no_passage_twice(corpus, retriever):
    plan = {QUESTION: {"queries": ["Gustave Eiffel born", DONE], "answers": ["Dijon"]}}
    generator = ToyGenerator(plan)
    result = search_predict(generator, QUESTION, retriever, config(corpus, hops=3, samples=1))

    hops = [entry for entry in result.trace if entry.kind == "tool"]
    assert [entry.input for entry in hops] == [QUESTION, "Gustave Eiffel born"]  # hop 3: the model wrote DONE
    first = retriever.search(QUESTION, 2)
    again = retriever.search("Gustave Eiffel born", 4)
    assert {p.id for p in first} & {p.id for p in again[:2]}  # the second search finds a passage of the first ...
    fresh = [p for p in again if p.id not in {p.id for p in first}][:2]
    assert hops[0].output == format_passages(first)
    assert hops[1].output == format_passages(fresh, start=3)  # ... which it leaves out, numbering on
    context = result.values["context"]
    assert context == (f"Search 1: {QUESTION}\n{format_passages(first)}\n"
                       f"Search 2: Gustave Eiffel born\n{format_passages(fresh, start=3)}")
    assert all(context.count(p.text) == 1 for p in first + fresh)

    queries = generator.calls("Search ")
    assert [prompt[-1]["content"] for prompt in queries] == ["Search 2:", "Search 3:"]
    assert f"Question: {QUESTION}\nSearch 1: {QUESTION}\n{format_passages(first)}\n\n" in queries[0][0]["content"]
    assert context + "\n\n" in queries[1][0]["content"]  # hop 3 is asked with both hops' passages
    assert context + "\n\n" in generator.calls("Answer:")[0][0]["content"]
    assert result.values["queries"] == f"{QUESTION}\nGustave Eiffel born"
    assert [(e.step, e.kind) for e in result.trace] == [
        ("hop/search", "tool"), ("query", "generate"), ("hop/search", "tool"), ("query", "generate"),
        ("answer", "generate")]
    assert result.answer == "Dijon"
    assert result.cost.model_calls == len(generator.requests) == 3
    assert result.cost.wall_seconds >= sum(entry.cost.wall_seconds for entry in hops) > 0


def test_hops_bound_the_searches(corpus, retriever):
    generator = ToyGenerator({QUESTION: {"queries": ["Gustave Eiffel born"], "answers": ["Dijon"]}})
    result = search_predict(generator, QUESTION, retriever, config(corpus, hops=1, samples=1))
    assert [entry.input for entry in result.trace if entry.kind == "tool"] == [QUESTION]
    assert not generator.calls("Search ")  # hop 1 searches the question: no query call


def test_the_answer_is_the_majority_of_the_sampled_answers(corpus, retriever):
    answers = ["Paris", "Dijon.", "dijon", "Rome", " Dijon "]
    generator = ToyGenerator({QUESTION: {"queries": [], "answers": answers}})
    result = search_predict(generator, QUESTION, retriever, config(corpus, hops=1, samples=5))
    (_, params), = generator.requests  # the five answers are one request
    assert params.n == 5 and params.temperature == 0.7 and params.max_tokens == DSPConfig().answer_tokens
    assert [c.answer for c in result.completions] == ["Paris", "Dijon", "dijon", "Rome", "Dijon"]
    assert result.votes == {"Paris": 1.0, "Dijon": 3.0, "Rome": 1.0}
    assert result.answer == "Dijon" and result.chosen is result.completions[1]


TRAIN = [("Which city is the capital of France?", "Paris"), ("Which city is the capital of Italy?", "Rome"),
         ("When was the Statue of Liberty completed?", "1886"), ("When was the Eiffel Tower completed?", "1889")]
TRAIN_PLAN = {  # right ("paris": Paris normalized), wrong, right, right
    TRAIN[0][0]: {"queries": [DONE], "answers": ["paris"]}, TRAIN[1][0]: {"queries": [DONE], "answers": ["Milan"]},
    TRAIN[2][0]: {"queries": [DONE], "answers": ["1886."]}, TRAIN[3][0]: {"queries": [DONE], "answers": ["1889"]}}


def test_demonstrations_are_the_runs_whose_answer_was_right(corpus, retriever):
    generator = ToyGenerator({**TRAIN_PLAN, QUESTION: {"queries": [DONE], "answers": ["Dijon"]}})
    found = bootstrap(generator, retriever, TRAIN, config(corpus, demos=2, samples=1))
    assert found.tried == 3  # the fourth is not run: two were kept
    assert [(demo.question, demo.answer) for demo in found.demonstrations] == [(TRAIN[0][0], "paris"),
                                                                                (TRAIN[2][0], "1886")]
    assert found.cost.model_calls == len(generator.requests) == 6  # a DONE query and an answer each
    shown = found.demonstrations[0].text()
    assert shown.startswith(f"Question: {TRAIN[0][0]}\nSearch 1: {TRAIN[0][0]}\n[1] Paris is the capital of France.")
    assert shown.endswith("\nAnswer: paris\n\n")

    generator.requests.clear()
    result = dsp(generator, QUESTION, retriever, config(corpus, demos=2, samples=1), demonstrations=found)
    prompt = generator.calls("Answer:")[0][0]["content"]
    shown = "".join(demo.text() for demo in found.demonstrations)
    assert prompt.startswith(shown + f"Question: {QUESTION}\n")
    assert TRAIN[1][0] not in prompt and TRAIN[1][0] not in generator.calls("Search ")[0][0]["content"]
    assert result.trace[0].kind == "demonstrate" and result.trace[0].cost == Cost()  # given: counted where spent
    assert result.cost.model_calls == 2


def test_bootstrapping_counts_in_the_cost_and_its_share_in_the_trace(corpus, retriever, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in TRAIN))
    assert read_examples(train) == TRAIN
    generator = ToyGenerator({**TRAIN_PLAN, QUESTION: {"queries": [DONE], "answers": ["Dijon"]}})
    result = dsp(generator, QUESTION, retriever, config(corpus, demos=1, samples=1), examples=read_examples(train))
    demonstrate = result.trace[0]
    assert (demonstrate.step, demonstrate.kind) == ("demonstrate", "demonstrate")
    assert demonstrate.input == "bootstrapped: 1 of 4 examples run"
    assert demonstrate.output.startswith("1 demonstrations kept\n\nQuestion: Which city is the capital of France?")
    assert demonstrate.cost.model_calls == 2 and demonstrate.cost.wall_seconds > 0
    assert result.cost.model_calls == len(generator.requests) == 4  # bootstrapping's 2 + the question's 2
    assert result.cost.wall_seconds >= demonstrate.cost.wall_seconds + sum(
        e.cost.wall_seconds for e in result.trace if e.kind == "tool")


def test_without_examples_it_runs_zero_shot_and_says_so(corpus, retriever):
    generator = ToyGenerator({QUESTION: {"queries": [DONE], "answers": ["Dijon"]}})
    result = dsp(generator, QUESTION, retriever, config(corpus, samples=1))
    assert result.trace[0].input == "zero-shot: no training examples (train)"
    assert result.trace[0].output == "0 demonstrations kept"
    assert generator.calls("Answer:")[0][0]["content"].startswith(f"Question: {QUESTION}\n")
    generator = ToyGenerator({QUESTION: {"queries": [DONE], "answers": ["Dijon"]}})
    result = dsp(generator, QUESTION, retriever, config(corpus, samples=1, demos=0), examples=TRAIN)
    assert result.trace[0].input == "zero-shot: demos=0" and len(generator.requests) == 2


@pytest.mark.parametrize(("fields", "message"), [
    ({"hops": 0}, "hops=0 is out of range: must be in [1, 64]"),
    ({"samples": 65}, "samples=65 is out of range: must be in [1, 64]"),
    ({"demos": -1}, "demos=-1 is out of range: must be in [0, 64]"),
    ({"train_limit": 0}, "train_limit=0 is out of range: must be in [1, 1000]"),
    ({"hops": 2.5}, "hops=2.5 must be an int"),
    ({"train": "/no/such/train.jsonl"}, "train='/no/such/train.jsonl' is not a file"),
])
def test_bad_values_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DSPConfig(**fields)


@pytest.mark.parametrize(("line", "message"), [
    ('{"question": "q"}', "train.jsonl:2: an example is an object with a non-empty string 'question'"),
    ('{"question": "", "answer": "a"}', "train.jsonl:2: an example"),
    ("[1]", "train.jsonl:2: expected a JSON object"),
    ("{", "train.jsonl:2: not valid JSON"),
])
def test_a_bad_training_line_is_refused_with_its_place(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "q", "answer": 3}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_examples(path)


def test_registered_with_its_retriever_and_training_file(corpus, tmp_path):
    spec = get_strategy("dsp")
    with pytest.raises(ValueError, match="retriever is required by strategy 'dsp'"):
        spec.parse({})
    with pytest.raises(ValueError, match="max_tool_calls is not an option of strategy 'dsp'"):
        spec.parse({"retriever": f"bm25:{corpus}", "max_tool_calls": 2})
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in TRAIN))
    n, options, overrides = spec.parse({"retriever": f"bm25:{corpus}", "train": str(train), "demos": 1, "hops": 1,
                                        "samples": 2, "passages": 1})
    generator = ToyGenerator({**TRAIN_PLAN, QUESTION: {"queries": [], "answers": ["Dijon", "Paris"]}})
    result = spec.run(generator, QUESTION, n, SamplingParams(temperature=0.5, max_tokens=64), options, None, overrides)
    assert result.trace[0].input == "bootstrapped: 1 of 4 examples run (kept for later questions)"
    assert f"Question: {TRAIN[0][0]}\nSearch 1: {TRAIN[0][0]}\n[1] Paris" in result.trace[0].output
    assert [e.input for e in result.trace if e.kind == "tool"] == [QUESTION]  # the question's own hops
    assert result.answer == "Dijon" and result.votes == {"Dijon": 1.0, "Paris": 1.0}  # a tie: the first seen
    assert result.cost.model_calls == 2

    # a second question on the same generator reuses the demonstrations: no example runs again
    generator.plan[TRAIN[3][0]] = {"queries": [], "answers": ["1889"]}
    generator.requests.clear()
    again = spec.run(generator, TRAIN[3][0], n, SamplingParams(temperature=0.5, max_tokens=64), options, None,
                     overrides)
    assert again.trace[0].input == "given: bootstrapped earlier, its cost counted there"
    assert again.trace[0].output == result.trace[0].output and again.trace[0].cost == Cost()
    assert again.cost.model_calls == len(generator.requests) == 1  # its own answer call only
    # another generator, or the training file changed, bootstraps again
    other = ToyGenerator(dict(generator.plan))
    assert spec.run(other, QUESTION, n, SamplingParams(temperature=0.5, max_tokens=64), options, None,
                    overrides).trace[0].input.startswith("bootstrapped: 1 of 4 examples run")
    train.write_text(train.read_text() + json.dumps({"question": "Q?", "answer": "A"}) + "\n")
    assert spec.run(generator, QUESTION, n, SamplingParams(temperature=0.5, max_tokens=64), options, None,
                    overrides).trace[0].input.startswith("bootstrapped: 1 of 5 examples run")
