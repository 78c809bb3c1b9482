"""`metagen generate --strategy search --retriever SPEC`: a bad or missing retriever refused by
name before any model loads."""

from __future__ import annotations

import pytest

from metagen.cli import common, main


@pytest.mark.parametrize(("argv", "message"), [
    ([], "retriever is required by strategy 'search': what the search tool searches: bm25:PATH | dense:PATH"),
    (["--retriever", "bm25:/no/such/corpus.jsonl"], "retriever='bm25:/no/such/corpus.jsonl': corpus "
                                                    "'/no/such/corpus.jsonl' does not exist"),
    (["--retriever", "elastic:x"], "retriever='elastic:x' must be one of bm25:PATH | dense:PATH | http"),
    (["--retriever", "http://h:1/search?x=1"], "without a query or fragment"),
    (["--retriever", "http://h:1/search", "--passages", "0"], "passages=0 is out of range: must be in [1, 1000]"),
])
def test_a_bad_retriever_is_refused_by_name_before_loading(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", "a", "--no-chat", "--strategy", "search", *argv]) == 2
    assert message in capsys.readouterr().err


def test_self_ask_search_requires_a_retriever_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", "a", "--no-chat", "--strategy", "self_ask_search"]) == 2
    assert "retriever is required by strategy 'self_ask_search'" in capsys.readouterr().err


def test_the_retriever_flag_is_refused_without_the_search_strategy(capsys):
    assert main(["generate", "a", "--no-chat", "--retriever", "http://h:1/search"]) == 2
    assert "--retriever" in capsys.readouterr().err
