"""Self-ask with search: each follow-up question is a BM25 query, a short model call answers it
from the top passages, the answer goes back after "Intermediate answer:", and the final answer
is extracted; the trace holds each hop with its passages."""

from __future__ import annotations


import pytest

from metagen.retrieval.base import format_passages
from metagen.sampling import SamplingParams
from metagen.strategies.chain_programs import self_ask_search
from metagen.strategies.registry import StrategyOptions, get_strategy
from tests.strategies.test_chain import ScriptedGenerator, assistant, model_cost
from tests.retrieval.corpus import write_corpus

pytest.importorskip("bm25s")

RECORDS = [
    {"id": "e", "text": "The Eiffel Tower was completed in 1889.", "title": "Eiffel Tower"},
    {"id": "s", "text": "The Statue of Liberty was completed in 1886.", "title": "Statue of Liberty"},
    {"id": "p", "text": "Paris is the capital of France."},
    {"id": "r", "text": "Rome is the capital of Italy."},
]
SCRIPT = [
    (" Yes.\nFollow up: When was the Eiffel Tower completed?\n", "Intermediate answer:"),
    ("In 1889.", None),  # read from the passages
    ("Follow up: When was the Statue of Liberty completed?\n", "Intermediate answer:"),
    ("In 1886.", None),
    ("So the final answer is: the Statue of Liberty.\n", "\nQuestion:"),
]
QUESTION = "Which was completed first, the Eiffel Tower or the Statue of Liberty?"


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    return write_corpus(tmp_path, monkeypatch, RECORDS)


def test_each_follow_up_is_answered_from_the_top_passages(corpus):
    from metagen.retrieval import BM25Retriever

    retriever = BM25Retriever(corpus)
    generator = ScriptedGenerator(SCRIPT)
    result = self_ask_search(generator, QUESTION, retriever, k=2)
    prompts = generator.prompts
    first_hop = format_passages(retriever.search("When was the Eiffel Tower completed?", 2))
    second_hop = format_passages(retriever.search("When was the Statue of Liberty completed?", 2))
    assert first_hop.startswith("[1] Eiffel Tower:") and second_hop.startswith("[1] Statue of Liberty:")
    assert "Passages:\n" + first_hop + "\n" in prompts[1][0]["content"]
    assert prompts[1][0]["content"].endswith("Question: When was the Eiffel Tower completed?")
    assert assistant(prompts[2]).endswith(
        "Follow up: When was the Eiffel Tower completed?\nIntermediate answer: In 1889.\n")
    assert "Passages:\n" + second_hop + "\n" in prompts[3][0]["content"]
    assert assistant(prompts[4]).endswith("Intermediate answer: In 1886.\n")
    assert result.answer == "the Statue of Liberty"

    assert [(e.step, e.kind) for e in result.trace] == [
        ("decomposition", "generate"), ("passages/search", "tool"), ("intermediate", "generate"),
        ("decomposition", "generate"), ("passages/search", "tool"), ("intermediate", "generate"),
        ("decomposition", "generate"), ("answer", "transform")]
    hops = [e for e in result.trace if e.kind == "tool"]
    assert [(e.input, e.output) for e in hops] == [("When was the Eiffel Tower completed?", first_hop),
                                                   ("When was the Statue of Liberty completed?", second_hop)]
    assert result.cost.model_calls == model_cost([text for text, _ in SCRIPT]).model_calls
    assert result.cost.wall_seconds >= sum(e.cost.wall_seconds for e in hops) > 0


def test_registered_with_its_retriever_and_passages(corpus):
    spec = get_strategy("self_ask_search")
    with pytest.raises(ValueError, match="retriever is required by strategy 'self_ask_search'"):
        spec.parse({})
    n, options, overrides = spec.parse({"retriever": f"bm25:{corpus}", "passages": 1})
    generator = ScriptedGenerator(SCRIPT)
    result = spec.run(generator, QUESTION, n, SamplingParams(temperature=0.0, max_tokens=256), options, None, overrides)
    passages = "Passages:\n[1] Eiffel Tower: The Eiffel Tower was completed in 1889.\n\n"
    assert passages in generator.prompts[1][0]["content"]  # passages=1: the top one only
    assert result.answer == "the Statue of Liberty"
    assert options == StrategyOptions()
