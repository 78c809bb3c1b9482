"""The `metagen` field and the model name strategy:model -> StrategyRequest: which option each
refusal names, and the bound `max_n` puts on the work a request asks for."""

from __future__ import annotations

import pytest

from metagen.serve.body import APIError
from metagen.serve.completion_request import parse_completion

pytestmark = pytest.mark.slow  # the embedded model's tokenizer


def refusal(model, body, **options) -> APIError:
    with pytest.raises(APIError) as raised:
        parse_completion(body, model=model, served_name="m", max_rows=8, **options)
    return raised.value


def test_strategy_errors_name_the_option_given_or_metagen(model):
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "best_of_n", "n": "x"}})
    assert error.param == "metagen.n"
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "best_of_n", "no such option": 1}})
    assert error.param == "metagen.no such option"  # the key as given, not "metagen.no"


@pytest.mark.parametrize(("body", "options", "param", "message"), [
    ({"prompt": "Hi", "metagen": {"strategy": "self_consistency", "n": 10**9}}, {}, "metagen.n",
     "metagen.n=1000000000 is out of range: must be <= 128 (--max-n"),
    ({"prompt": "Hi", "metagen": {"strategy": "mcts", "value": "steps", "expansions": 129}}, {}, "metagen.expansions",
     "metagen.expansions=129 is out of range: must be <= 128 (--max-n"),
    ({"prompt": "Hi", "metagen": {"strategy": "rebase", "value": "steps", "max_steps": 10**6}}, {"max_n": 64},
     "metagen.max_steps", "metagen.max_steps=1000000 is out of range: must be <= 64 (--max-n"),
    ({"prompt": "Hi", "model": "self_consistency:m"}, {"max_n": 4}, "metagen.n",
     "metagen.n=8 is out of range: must be <= 4 (--max-n"),
    ({"prompt": "Hi", "n": 5}, {"max_n": 4}, "n", "n=5 is out of range: must be <= 4 (--max-n 4)"),
    ({"prompt": "Hi", "n": 5, "best_of": 5}, {"max_n": 4}, "n", "n=5 is out of range: must be <= 4 (--max-n 4)"),
])
def test_options_that_size_the_work_are_bounded_by_max_n(model, body, options, param, message):
    """Checked while parsing, before anything is allocated for the request."""
    error = refusal(model, body, **options)
    assert error.param == param and error.status == 400
    assert message in error.message


def test_a_strategy_template_with_a_format_spec_is_refused(model):
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "self_refine",
                                                         "critique_template": "{answer:a>20000000}"}})
    assert error.param == "metagen.critique_template" and "format spec" in error.message


def test_a_request_names_no_corpus_training_file_or_url(model, tmp_path):
    """metagen.retriever and dsp's metagen.train would name a file or a URL for the server to
    open: refused by name, whether the server has a retriever or not, and whether the file exists."""
    corpus, train = tmp_path / "c.jsonl", tmp_path / "train.jsonl"
    corpus.write_text('{"id": "a", "text": "secret"}\n')
    train.write_text('{"question": "q", "answer": "a"}\n')
    for name in ("search", "self_ask_search", "dsp"):
        for served in (None, f"bm25:{corpus}"):
            error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": name, "retriever": f"bm25:{corpus}"}},
                            retriever=served)
            assert error.param == "metagen.retriever" and error.status == 400
            assert "metagen.retriever is not accepted: it names a file or a URL, and the server opens none that a " \
                   "request names; this server's strategies search its own --retriever" in error.message
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "dsp", "train": str(train)}},
                    retriever=f"bm25:{corpus}")
    assert error.param == "metagen.train" and error.message == (
        "metagen.train is not accepted: it names a file or a URL, and the server opens none that a request names")


def test_search_strategies_search_the_servers_retriever_or_are_refused_without_one(model, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "Paris is the capital of France."}\n')
    for name in ("search", "self_ask_search", "dsp"):
        error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": name}})
        assert error.param == "metagen.strategy" and error.status == 400
        assert error.message == (f"strategy {name!r} is not served here: it searches a corpus, and this server was "
                                 "started without one; start it with metagen serve --retriever bm25:PATH | dense:PATH "
                                 "| URL")
        parsed = parse_completion({"prompt": "Hi", "metagen": {"strategy": name, "passages": 2}}, model=model,
                                  served_name="m", max_rows=8, retriever=f"bm25:{corpus}")
        assert parsed.strategy.overrides == {"retriever": f"bm25:{corpus}", "passages": 2}
    error = refusal(model, {"prompt": "Hi", "metagen": {"strategy": "dsp", "hops": 65}}, retriever=f"bm25:{corpus}")
    assert error.param == "metagen.hops" and "metagen.hops=65 is out of range: must be in [1, 64]" in error.message
