"""Proxy mode (`metagen serve --backend URL...`) over real servers: a `metagen serve` on the
embedded model (the session's `server`), and two llama-cpp-python servers over the embedded GGUF
as one fleet. Driven with the openai client; each answer is compared with asking the backend
directly, and every token a strategy spent is counted in usage and Cost."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .server import llama_process, serve_process, stop

openai = pytest.importorskip("openai")
pytest.importorskip("httpx")
pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 7 + 5? Answer with a number."}]
PROMPT = "The capital of France is"


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _by_backend(proxy, name: str) -> dict[str, float]:
    """A per-backend metric of /metrics: {backend URL: value}."""
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in proxy.get("/metrics").splitlines()
            if line.startswith(name + "{")}


# --- over metagen serve --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def proxy(server):
    with serve_process("--backend", server.url + "/v1", "--max-rows", "8") as running:
        yield running


@pytest.fixture
def through(proxy):
    with _client(proxy.url) as opened:
        yield opened


@pytest.fixture
def direct(server):
    with _client(server.url) as opened:
        yield opened


def test_plain_requests_equal_asking_the_backend(through, direct, served_model):
    sampling = {"max_tokens": 10, "temperature": 0}
    chat = through.chat.completions.create(model=served_model, messages=QUESTION, **sampling)
    alone = direct.chat.completions.create(model=served_model, messages=QUESTION, **sampling)
    assert chat.choices[0].message.content == alone.choices[0].message.content
    assert chat.usage.prompt_tokens == alone.usage.prompt_tokens
    assert chat.usage.completion_tokens == alone.usage.completion_tokens
    seeded = {"max_tokens": 8, "temperature": 0.9, "seed": 5, "n": 2, "extra_body": {"top_k": 20}}
    text = through.completions.create(model=served_model, prompt=PROMPT, **seeded)
    same = direct.completions.create(model=served_model, prompt=PROMPT, **seeded)
    assert [c.text for c in text.choices] == [c.text for c in same.choices]


def test_streams_are_streamed_with_usage(through, served_model):
    whole = through.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=10, temperature=0)
    pieces, usage = [], None
    for chunk in through.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert len([p for p in pieces if p]) > 1  # several chunks, not one answer
    assert "".join(pieces) == whole.choices[0].message.content
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, whole.usage.completion_tokens)


def test_a_strategy_runs_over_the_backend_and_counts_every_token(through, proxy, served_model):
    before = proxy.metric("metagen_backend_requests_total")
    answer = through.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=8, temperature=0.9,
                                             seed=3, extra_body={"metagen": {"strategy": "self_consistency", "n": 4}})
    block = answer.model_extra["metagen"]
    cost = block["cost"]
    assert len(block["candidates"]) == 4 and block["candidates"][block["chosen"]]["text"] == \
        answer.choices[0].message.content
    assert answer.usage.completion_tokens == cost["generated_tokens"] == sum(c["tokens"] for c in block["candidates"])
    assert answer.usage.prompt_tokens == cost["prompt_tokens_computed"] + cost["prompt_tokens_reused"] > 0
    assert block["requests"] == cost["model_calls"] == 1  # metagen honours n: one request of 4 rows
    assert proxy.metric("metagen_backend_requests_total") - before == 1


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"top_kk": 3}, "top_kk", "unknown field"),
    ({"temperature": -1}, "temperature", "temperature"),
    ({"logprobs": True}, "logprobs", "proxy mode"),
    ({"metagen": {"strategy": "self_consistency", "n": 0}}, "metagen.n", ">= 1"),
    ({"metagen": {"strategy": "tokenwise_cd", "value": "steps"}}, "metagen.strategy", "local_cache"),
    ({"metagen": {"strategy": "best_of_n", "n": 2}}, "metagen.strategy", "full_distributions"),
])
def test_refusals_name_the_field_or_the_capability(through, served_model, body, param, words):
    with pytest.raises(openai.BadRequestError) as raised:
        through.chat.completions.create(model=served_model, messages=QUESTION, max_tokens=4, extra_body=body)
    error = raised.value.body
    assert error["param"] == param and words in error["message"]


def test_models_health_tokenize_and_metrics(proxy, server, served_model):
    listed = json.loads(proxy.get("/v1/models"))["data"]
    assert [entry["id"] for entry in listed] == [served_model]
    assert listed[0]["backends"] == [server.url + "/v1"] and listed[0]["backend_engine"] == "metagen"
    status, health = _health(proxy.url)
    assert status == 200 and health["backends"] == {server.url + "/v1": "up"}
    assert _post(proxy.url + "/tokenize", {"prompt": PROMPT}) == _post(server.url + "/tokenize", {"prompt": PROMPT})
    assert _post(proxy.url + "/detokenize", {"tokens": [504, 3575]}) == \
        _post(server.url + "/detokenize", {"tokens": [504, 3575]})
    assert proxy.metric("metagen_backend_answered_total") >= 1
    assert proxy.metric("metagen_requests_finished_total") >= 1


# --- over two llama.cpp servers as one fleet -----------------------------------------------------------

@pytest.fixture(scope="module")
def llama_fleet():
    pytest.importorskip("llama_cpp.server")
    with llama_process() as first, llama_process() as second:
        with serve_process("--backend", first.url + "/v1", second.url + "/v1", "--served-model-name", "smol") as proxy:
            yield proxy, first, second


def test_llama_cpp_plain_stream_and_refusals(llama_fleet):
    proxy, first, _ = llama_fleet
    with _client(proxy.url) as through, _client(first.url) as direct:
        greedy = through.chat.completions.create(model="smol", messages=QUESTION, max_tokens=8, temperature=0)
        # llama.cpp's own defaults include repeat_penalty 1.1: the proxy sends metagen's neutral 1.0
        alone = direct.chat.completions.create(model=direct.models.list().data[0].id, messages=QUESTION, max_tokens=8,
                                               temperature=0, extra_body={"repeat_penalty": 1.0})
        assert greedy.choices[0].message.content == alone.choices[0].message.content
        assert greedy.usage.completion_tokens == alone.usage.completion_tokens
        pieces = [chunk.choices[0].text for chunk in through.completions.create(
            model="smol", prompt=PROMPT, max_tokens=6, temperature=0, stream=True)]
        whole = through.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0)
        assert len(pieces) > 2 and "".join(pieces) == whole.choices[0].text
        with pytest.raises(openai.BadRequestError) as raised:  # llama.cpp streams no usage: refused, not faked
            through.completions.create(model="smol", prompt=PROMPT, max_tokens=2, stream=True,
                                       stream_options={"include_usage": True})
        assert raised.value.body["param"] == "stream_options.include_usage"
        with pytest.raises(openai.BadRequestError) as raised:
            through.completions.create(model="smol", prompt=PROMPT, max_tokens=2, extra_body={"ignore_eos": True})
        assert raised.value.body["param"] == "ignore_eos" and "llama.cpp" in raised.value.body["message"]
        with pytest.raises(openai.BadRequestError) as raised:  # named: the capability and the servers lacking it
            through.chat.completions.create(model="smol", messages=QUESTION, max_tokens=2,
                                            extra_body={"metagen": {"strategy": "best_of_n", "n": 2}})
        message = raised.value.body["message"]
        assert "needs full_distributions, which the backend fleet (llama.cpp at" in message and first.url in message
    status, body = _post(proxy.url + "/tokenize", {"prompt": PROMPT})
    assert status == 501 and first.url in body["error"]["message"]


def test_llama_cpp_fleet_runs_a_strategy_across_both_servers(llama_fleet):
    proxy, first, second = llama_fleet
    with _client(proxy.url) as through:
        answer = through.chat.completions.create(
            model="smol", messages=QUESTION, max_tokens=6, temperature=0.9, seed=2,
            extra_body={"metagen": {"strategy": "best_of_n_logprob", "n": 4}})
    block = answer.model_extra["metagen"]
    cost = block["cost"]
    # llama.cpp ignores n: 4 requests, each counted
    assert block["requests"] == cost["model_calls"] == 4 and len(block["candidates"]) == 4
    assert all(candidate["score"] is not None for candidate in block["candidates"])
    assert answer.usage.completion_tokens == cost["generated_tokens"] > 0
    assert answer.usage.prompt_tokens == cost["prompt_tokens_computed"] + cost["prompt_tokens_reused"]
    answered = _by_backend(proxy, "metagen_backend_answered_total")
    assert answered[first.url + "/v1"] > 0 and answered[second.url + "/v1"] > 0  # one fleet: both served


def test_a_dead_backend_is_failed_over_then_named(llama_fleet):
    """Runs last: it stops the fleet's servers."""
    proxy, first, second = llama_fleet
    stop(second)
    with _client(proxy.url) as through:
        for _ in range(6):  # every request is answered; the dead one is tried, fails over and is taken out
            answer = through.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0)
            assert answer.choices[0].text
            if _by_backend(proxy, "metagen_backend_up")[second.url + "/v1"] == 0:
                break
        assert _by_backend(proxy, "metagen_backend_up") == {first.url + "/v1": 1, second.url + "/v1": 0}
        status, health = _health(proxy.url)
        assert status == 200 and health["backends"][second.url + "/v1"].startswith("down")
        # taken out by a request failing on it, or by its health check before one did
        assert _by_backend(proxy, "metagen_backend_errors_total")[second.url + "/v1"] >= 1 or \
            "health check" in health["backends"][second.url + "/v1"]
        stop(first)
        started = time.monotonic()
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as raised:
                through.completions.create(model="smol", prompt=PROMPT, max_tokens=3, stream=stream)
            assert raised.value.status_code in (502, 503)
            message = raised.value.body["message"]
            assert first.url in message and second.url in message
        assert time.monotonic() - started < 30  # answered, not hung
        assert through.models.list().data[0].id == "smol"  # the proxy keeps answering
    status, health = _health(proxy.url)
    assert status == 503 and all(state.startswith("down") for state in health["backends"].values())


@pytest.mark.parametrize(("options", "message"), [
    (["--backend", "http://127.0.0.1:9/v1"], "no endpoint of the fleet answered its probe: http://127.0.0.1:9/v1"),
    (["--backend", "http://127.0.0.1:9/v1", "--dtype", "fp32"], "--dtype configure the local model"),
    (["--tokenizer", "tokenizer.json"], "--tokenizer configure proxy mode: add --backend URL"),
    (["--backend-stall-seconds", "2"], "--backend-stall-seconds configure proxy mode: add --backend URL"),
    (["--backend", "http://127.0.0.1:9/v1", "--backend-stall-seconds", "0"],
     "--backend-stall-seconds 0.0 must be > 0 seconds"),
    (["--engine", "vllm"], "--engine configure proxy mode: add --backend URL"),
    (["--backend", "http://127.0.0.1:9/v1", "--engine", "tgi"], "argument --engine: invalid choice: 'tgi'"),
])
def test_proxy_options_are_checked_at_start(options, message):
    finished = subprocess.run([sys.executable, "-m", "metagen.cli", "serve", "--port", "0", *options],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0 and message in finished.stderr


# --- over a scripted backend answering nonsense ----------------------------------------------------------
# The fake (tests/remote/fake_server.py) answers as vLLM does; its edits break the answer the way a
# faulty or cut-off backend would, and the proxy must answer an error naming what the backend sent.

@pytest.fixture(scope="module")
def broken():
    from tests.remote.fake_server import FakeServer

    with FakeServer("vllm") as fake, serve_process("--backend", fake.url, "--served-model-name", "fake") as proxy:
        yield fake, proxy


@pytest.fixture
def backend(broken):
    fake, proxy = broken
    yield fake, proxy
    fake.stream_edit = fake.usage_edit = None
    fake.rejects.clear()


def _sse(url: str, body: dict) -> tuple[int, list]:
    """(status, [each data: payload, parsed, "[DONE]" as it is]) of a streamed request."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            lines = answer.read().decode().splitlines()
            status = answer.status
    except urllib.error.HTTPError as error:
        return error.code, [json.loads(error.read())]
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    return status, [item if item == "[DONE]" else json.loads(item) for item in data]


def test_a_backend_stream_cut_before_its_finish_is_relayed_as_an_error_chunk(backend):
    fake, proxy = backend
    fake.stream_edit = lambda chunks: [c for c in chunks if not any(x.get("finish_reason") for x in c["choices"])]
    status, events = _sse(proxy.url + "/v1/completions", {"model": "fake", "prompt": PROMPT, "max_tokens": 4})
    assert status == 200  # the first pieces were relayed before the end was missed
    assert [e for e in events[:-2] if "error" in e] == [] and any(e["choices"][0]["text"] for e in events[:-2])
    assert not any(c.get("finish_reason") for e in events[:-2] for c in e["choices"])  # no made-up finish
    error = events[-2]["error"]
    assert events[-1] == "[DONE]" and error["code"] == "backend_error"
    assert "ended without a finish_reason for choice 0 of 1" in error["message"] and fake.url in error["message"]


def test_a_backend_chunk_naming_a_choice_never_asked_for_is_answered_502(backend):
    fake, proxy = backend

    def stray(chunks):
        chunks[0]["choices"][0]["index"] = 3
        return chunks

    fake.stream_edit = stray
    status, events = _sse(proxy.url + "/v1/chat/completions",
                          {"model": "fake", "messages": QUESTION, "max_tokens": 4, "n": 2})
    assert status == 502 and events[0]["error"]["code"] == "backend_error"
    assert "choice index 3, but the request asked for 2 choices (0 to 1)" in events[0]["error"]["message"]
    status, answer = _post(proxy.url + "/v1/completions", {"model": "fake", "prompt": PROMPT, "max_tokens": 4})
    assert status == 200 and answer["choices"][0]["text"]  # the proxy still answers


@pytest.mark.parametrize("value", [-12, "many"])
def test_malformed_backend_usage_is_a_bad_gateway_never_a_400_or_a_negative_count(backend, value):
    fake, proxy = backend
    fake.usage_edit = lambda usage: {**usage, "completion_tokens": value}
    status, answer = _post(proxy.url + "/v1/completions", {"model": "fake", "prompt": PROMPT, "max_tokens": 4})
    assert status == 502 and answer["error"]["code"] == "backend_error"
    assert f"usage.completion_tokens={value!r}" in answer["error"]["message"]
    status, answer = _post(proxy.url + "/v1/chat/completions", {
        "model": "fake", "messages": QUESTION, "max_tokens": 4, "metagen": {"strategy": "self_consistency", "n": 2}})
    assert status == 502 and f"usage.completion_tokens={value!r}" in answer["error"]["message"]


# --- structured-output refusals name the field the request used ---------------------------------------

CONSTRAINTS = [  # each way of asking for a structured output, and the field a refusal of it names
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"json": {"type": "object"}}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "[ab]+"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": 'root ::= "a" | "b"'}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs.choice"),
]
XGRAMMAR_REFUSAL = ('{"object": "error", "message": "The provided JSON schema contains features not supported by '
                    'xgrammar.", "type": "BadRequestError", "param": null, "code": 400}')


def _refused(url: str, extra: dict, chat: bool, stream: bool = False):
    """The openai client's error for a request with `extra` (stream: the whole stream read)."""
    with _client(url) as client, pytest.raises(openai.BadRequestError) as raised:
        if chat:
            answer = client.chat.completions.create(model="fake", messages=QUESTION, max_tokens=3, stream=stream,
                                                    extra_body=extra)
        else:
            answer = client.completions.create(model="fake", prompt=PROMPT, max_tokens=3, stream=stream,
                                               extra_body=extra)
        if stream:
            list(answer)
    return raised.value


@pytest.mark.parametrize(("extra", "param"), CONSTRAINTS)
def test_a_backend_refusing_a_structured_output_is_400_naming_the_requests_field(backend, extra, param):
    """vLLM answers 400 with `param` null for a schema its grammar engine cannot take; the proxy
    names the field the request used (the backend's own field may differ), for plain requests,
    streamed or not, and for a strategy's."""
    fake, proxy = backend
    fake.reject(lambda body: "structured_outputs" in body, 400, XGRAMMAR_REFUSAL)
    for chat in (False, True):
        for stream in (False, True):
            error = _refused(proxy.url, extra, chat, stream)
            assert error.param == param and "not supported by xgrammar" in error.message
            assert error.body["type"] == "invalid_request_error" and error.body["code"] == "backend_rejected"
    error = _refused(proxy.url, {**extra, "metagen": {"strategy": "self_consistency", "n": 2}}, chat=True)
    assert error.param == param and "not supported by xgrammar" in error.message


def test_a_backend_refusal_about_something_else_names_no_constraint_field(backend):
    fake, proxy = backend
    fake.reject(lambda body: True, 400, '{"error": {"message": "max_tokens is too large for this model"}}')
    error = _refused(proxy.url, CONSTRAINTS[2][0], chat=True)
    assert error.param is None and "max_tokens is too large" in error.message


@pytest.fixture(scope="module")
def llama_fake():
    """metagen serve over a scripted llama.cpp server: GBNF grammars and response_format (chat) only."""
    from tests.remote.fake_server import FakeServer

    with FakeServer("llama.cpp") as fake, serve_process("--backend", fake.url, "--served-model-name", "fake") as proxy:
        yield fake, proxy


@pytest.mark.parametrize(("extra", "chat", "param", "words"), [
    (CONSTRAINTS[2][0], False, "structured_outputs.regex", "GBNF grammars, which have no regular expressions"),
    (CONSTRAINTS[2][0], True, "structured_outputs.regex", "GBNF grammars, which have no regular expressions"),
    ({"structured_outputs": {"grammar": 'start: "a"'}}, True, "structured_outputs.grammar", "Lark grammar"),
    (CONSTRAINTS[0][0], False, "response_format.json_schema.schema", "needs llama.cpp's /v1/chat/completions"),
    (CONSTRAINTS[1][0], False, "structured_outputs.json", "needs llama.cpp's /v1/chat/completions"),
])
def test_a_structured_output_the_backends_engine_cannot_take_is_400_naming_the_field(llama_fake, extra, chat, param,
                                                                                    words):
    fake, proxy = llama_fake
    posts = len(fake.posts())
    for stream in (False, True):
        error = _refused(proxy.url, extra, chat, stream)
        assert error.param == param and words in error.message
    if chat:  # a strategy's requests are refused alike
        error = _refused(proxy.url, {**extra, "metagen": {"strategy": "self_consistency", "n": 2}}, chat=True)
        assert error.param == param and words in error.message
    assert len(fake.posts()) == posts  # refused before anything was sent
