"""The search strategies through the API: `metagen serve --retriever bm25:PATH` builds the index
once at start-up, and a request's `metagen` field selecting dsp or self_ask_search searches it
(the same run as the library's on a LocalGenerator over the same corpus); a request naming its
own corpus is refused, and a server started without --retriever refuses the strategy, saying how
to start it."""

from __future__ import annotations

import json

import pytest

from metagen.decoding import LocalGenerator
from metagen.sampling import SamplingParams
from metagen.strategies.registry import get_strategy

from .server import serve_process

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

RECORDS = [
    {"id": "p", "text": "Paris is the capital of France."},
    {"id": "r", "text": "Rome is the capital of Italy."},
    {"id": "t", "text": "The Eiffel Tower in Paris was completed in 1889.", "title": "Eiffel Tower"},
]
QUESTION = [{"role": "user", "content": "When was the Eiffel Tower completed?"}]
SAMPLING = {"temperature": 0.9, "max_tokens": 12, "seed": 5}
DSP = {"strategy": "dsp", "hops": 2, "samples": 3, "passages": 1, "answer_tokens": 6}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    path = folder / "c.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in RECORDS))
    return path  # indexed into the shared cache: a fresh one would convert the model's weights again


@pytest.fixture(scope="module")
def search_server(corpus):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("bm25s")
    with serve_process("--max-rows", "4", "--no-prefix-cache", "--retriever", f"bm25:{corpus}") as running:
        yield running


@pytest.fixture
def search_client(search_server):
    with openai.OpenAI(base_url=search_server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as opened:
        yield opened


def _served_model(server) -> str:
    return json.loads(server.get("/v1/models"))["data"][0]["id"]


def _local(model, corpus, given: dict):
    """The strategy run by the library on a LocalGenerator with the request's seed, searching the
    same corpus (jump_forward=False: the engine decodes one token per step)."""
    spec = get_strategy(given["strategy"])
    n, options, overrides = spec.parse({**{k: v for k, v in given.items() if k != "strategy"},
                                        "retriever": f"bm25:{corpus}"})
    params = SamplingParams(**SAMPLING)
    return spec.run(LocalGenerator(model, chat=True, jump_forward=False), QUESTION, n, params, options,
                    params.make_generator(), overrides)


def test_dsp_searches_the_servers_retriever(search_client, search_server, model, corpus):
    answer = search_client.chat.completions.create(model=_served_model(search_server), messages=QUESTION, **SAMPLING,
                                                   extra_body={"metagen": DSP})
    block = answer.model_extra["metagen"]
    local = _local(model, corpus, DSP)
    assert block["strategy"] == "dsp" and len(block["candidates"]) == DSP["samples"]
    assert [c["text"] for c in block["candidates"]] == [c.text for c in local.completions]
    assert block["votes"] == local.votes and block["answer"] == local.answer
    assert answer.choices[0].message.content == local.chosen.text
    # every query call and the answers' one call; the server's tally of their tokens is the strategy's Cost
    assert block["requests"] == sum(entry.kind == "generate" for entry in local.trace) >= 2
    assert answer.usage.completion_tokens == block["cost"]["generated_tokens"] == local.cost.generated_tokens
    assert answer.usage.prompt_tokens == block["cost"]["prompt_tokens_computed"] == local.cost.prompt_tokens_computed
    assert local.trace[0].input == "zero-shot: no training examples (train)"  # a request names no training file


def test_self_ask_search_runs_through_the_server(search_client, search_server):
    answer = search_client.chat.completions.create(
        model=_served_model(search_server), messages=QUESTION, **SAMPLING,
        extra_body={"metagen": {"strategy": "self_ask_search", "passages": 1, "max_tool_calls": 1}})
    block = answer.model_extra["metagen"]
    assert block["strategy"] == "self_ask_search" and block["requests"] >= 1
    assert answer.usage.completion_tokens == block["cost"]["generated_tokens"]


@pytest.mark.parametrize(("given", "param"), [
    ({"strategy": "dsp", "retriever": "bm25:/etc/passwd"}, "metagen.retriever"),
    ({"strategy": "self_ask_search", "retriever": "http://127.0.0.1:1/search"}, "metagen.retriever"),
    ({"strategy": "dsp", "train": "/etc/hostname"}, "metagen.train"),
])
def test_a_request_naming_its_own_file_or_url_is_refused(search_client, search_server, given, param):
    with pytest.raises(openai.BadRequestError) as raised:
        search_client.chat.completions.create(model=_served_model(search_server), messages=QUESTION, **SAMPLING,
                                              extra_body={"metagen": given})
    error = raised.value.body
    assert error["param"] == param
    assert f"{param} is not accepted: it names a file or a URL, and the server opens none" in error["message"]


def test_without_a_retriever_the_server_refuses_the_search_strategies(client, served_model):
    """The folder's shared server (conftest.py) was started without --retriever."""
    for name in ("dsp", "self_ask_search", "search"):
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model=served_model, messages=QUESTION, **SAMPLING,
                                           extra_body={"metagen": {"strategy": name}})
        assert raised.value.body["param"] == "metagen.strategy"
        assert "start it with metagen serve --retriever" in raised.value.body["message"]
