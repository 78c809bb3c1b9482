"""The retriever as a chain's tool: the model's <search> call answered by BM25's passages inline,
the model continuing the same message, the search's cost in the chain's."""

from __future__ import annotations


import pytest

from metagen.decoding import Cost
from metagen.retrieval import Retrieval, Retriever, RetrieverTool
from metagen.strategies.chain_programs import SEARCH_SYSTEM, search_binding, search_chain
from tests.strategies.test_chain import ScriptedGenerator, assistant, model_cost
from tests.retrieval.corpus import write_corpus

pytest.importorskip("bm25s")


def test_search_calls_are_answered_by_the_retriever_inline(tmp_path, monkeypatch):
    from metagen.retrieval import BM25Retriever

    corpus = write_corpus(tmp_path, monkeypatch, [
        {"id": "e", "text": "The Eiffel Tower was completed in 1889.", "title": "Eiffel Tower"},
        {"id": "s", "text": "The Statue of Liberty was completed in 1886.", "title": "Statue of Liberty"},
        {"id": "p", "text": "Paris is the capital of France."}])
    script = [("I need the date. <search>Eiffel Tower completed", "</search>"), ("It was 1889. The answer is 1889.", None)]
    generator = ScriptedGenerator(script)
    result = search_chain(generator, "When was the Eiffel Tower completed?", BM25Retriever(corpus), k=2)
    results = ("<search>Eiffel Tower completed</search>\n<results>\n[1] Eiffel Tower: The Eiffel Tower was completed "
               "in 1889.\n[2] Statue of Liberty: The Statue of Liberty was completed in 1886.\n</results>\n")
    assert generator.prompts[0][0] == {"role": "system", "content": SEARCH_SYSTEM}
    assert assistant(generator.prompts[1]) == "I need the date. " + results
    assert result.chosen.answer == "1889"
    tool_step = [entry for entry in result.trace if entry.kind == "tool"]
    assert [(entry.step, entry.input) for entry in tool_step] == [("solution/search", "Eiffel Tower completed")]
    assert result.cost.model_calls == model_cost([text for text, _ in script]).model_calls
    assert result.cost.wall_seconds >= tool_step[0].cost.wall_seconds > 0


class EncodingRetriever(Retriever):
    """Answers every query with one passage and a known encoder cost (as a dense retriever would)."""

    def retrieve(self, query, k):
        from metagen.retrieval import Passage

        return Retrieval([Passage("x", f"about {query}", 1.0)], Cost(model_calls=1, prompt_tokens_computed=4,
                                                                      flops=80.0, wall_seconds=0.001))


def test_a_tools_own_model_cost_joins_the_chains():
    generator = ScriptedGenerator([("<search>q", "</search>"), ("done", None)])
    result = search_chain(generator, "question", EncodingRetriever(), k=1)
    tool_cost = next(entry.cost for entry in result.trace if entry.kind == "tool")
    assert (tool_cost.model_calls, tool_cost.prompt_tokens_computed, tool_cost.flops) == (1, 4, 80.0)
    assert result.cost.flops == model_cost(["<search>q", "done"]).flops + 80.0
    assert search_binding(EncodingRetriever(), 1).handler.k == 1
    with pytest.raises(ValueError, match=r"k=0 is out of range"):
        RetrieverTool(EncodingRetriever(), k=0)
    with pytest.raises(ValueError, match=r"retriever='bm25:x' must be a Retriever"):
        RetrieverTool("bm25:x")
