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


def test_a_strategy_reading_a_corpus_or_url_is_not_served(model, tmp_path):
    """metagen.retriever would name a file or a URL for the server to open: refused by name,
    with a corpus that exists as with none."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "secret"}\n')
    for name in ("search", "self_ask_search"):
        for given in ({"strategy": name, "retriever": f"bm25:{corpus}"}, {"strategy": name}):
            error = refusal(model, {"prompt": "Hi", "metagen": given})
            assert error.param == "metagen.strategy" and error.status == 400
            assert f"strategy {name!r} is not served: its metagen.retriever names a corpus path or a URL" in error.message
