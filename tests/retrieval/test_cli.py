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


@pytest.mark.parametrize(("argv", "message"), [
    ([], "retriever is required by strategy 'dsp'"),
    (["--retriever", "http://h:1/search", "--hops", "0"], "hops=0 is out of range: must be in [1, 64]"),
    (["--retriever", "http://h:1/search", "--samples", "65"], "samples=65 is out of range: must be in [1, 64]"),
    (["--retriever", "http://h:1/search", "--train", "/no/such/train.jsonl"],
     "train='/no/such/train.jsonl' is not a file"),
    (["--retriever", "http://h:1/search", "--max-tool-calls", "2"],
     "max_tool_calls is not an option of strategy 'dsp'"),
])
def test_dsp_options_are_refused_by_name_before_loading(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", "a", "--no-chat", "--strategy", "dsp", *argv]) == 2
    assert message in capsys.readouterr().err


def test_generate_help_names_dsp_and_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--hops INT", "--demos INT", "--samples INT", "--train STR", "--train-limit INT"):
        assert flag + " " in shown and "(dsp); " in shown
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "dsp Demonstrate-Search-Predict" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_dsp_runs_from_the_command_line_on_the_real_model(tmp_path, capsys):
    """Bootstrapping from the first example of a training file, two hops, two sampled answers: the
    candidates are the samples, the votes count their answers, the cost is the model's. (The
    cache stays the shared one: a fresh one would convert the model's weights again.)"""
    import json

    pytest.importorskip("bm25s")
    corpus, train = tmp_path / "c.jsonl", tmp_path / "train.jsonl"
    corpus.write_text("".join(json.dumps(record) + "\n" for record in [
        {"id": "p", "text": "Paris is the capital of France."}, {"id": "r", "text": "Rome is the capital of Italy."},
        {"id": "t", "text": "The Eiffel Tower in Paris was completed in 1889."}]))
    train.write_text('{"question": "What is the capital of Italy?", "answer": "Rome"}\n'
                     '{"question": "What is the capital of France?", "answer": "Paris"}\n')
    assert main(["generate", "When was the Eiffel Tower completed?", "--strategy", "dsp", "--retriever",
                 f"bm25:{corpus}", "--train", str(train), "--train-limit", "1", "--demos", "1", "--hops", "2",
                 "--samples", "2",
                 "--passages", "1", "--answer-tokens", "8", "--temperature", "0.7", "--seed", "0", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["strategy"] == "dsp" and len(payload["candidates"]) == 2
    answers = [c["answer"] for c in payload["candidates"] if c["answer"] is not None]
    assert sum(payload["votes"].values()) == len(answers) and sum(c["chosen"] for c in payload["candidates"]) == 1
    assert payload["cost"]["generated_tokens"] > 0 and payload["cost"]["wall_seconds"] > 0
