"""Bad input, oversized bodies, a full queue and clients that go away: OpenAI-style errors naming
the field, and a server that keeps answering after each."""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from .server import serve_process

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


def _post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(server.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def _raw_post(server, path: str, body: bytes, headers: dict) -> tuple[int, object, object]:
    """POST with exactly `headers` (urllib would add a form Content-Type of its own); the JSON answer."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.headers, json.loads(answer.read())  # headers: case-insensitive
    finally:
        connection.close()


JSON_BODY = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
@pytest.mark.parametrize("content_type, body", [
    ("text/plain", JSON_BODY),  # what a web page's fetch() or <form enctype="text/plain"> may send anywhere
    ("text/plain;charset=UTF-8", JSON_BODY),
    ("application/x-www-form-urlencoded", JSON_BODY),
    ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n'
     + JSON_BODY + b"\r\n--b--\r\n"),
    (None, JSON_BODY),  # a fetch() of a Blob without a type sends no Content-Type
])
def test_bodies_not_declared_json_are_415(server, path, content_type, body):
    headers = {} if content_type is None else {"Content-Type": content_type}
    status, _, answer = _raw_post(server, path, body, headers)
    assert status == 415, answer
    error = answer["error"]
    assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"
    assert (repr(content_type) if content_type else "no Content-Type") in error["message"]
    assert "application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8", "application/vnd.api+json"])
def test_json_bodies_are_read_whatever_their_parameters(server, content_type):
    status, _, answer = _raw_post(server, "/tokenize", b'{"prompt": "Hi"}', {"Content-Type": content_type})
    assert status == 200 and answer["count"] >= 1, answer


def test_metrics_series_stay_few_whatever_paths_are_asked(server):
    """Every path a client invents was a series of its own in /metrics, without limit (and a path
    with a quote broke the exposition format): unmatched paths share the label "other"."""
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.\"%{}"
    for _ in range(200):
        path = "/" + "/".join("".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 3)))
        with pytest.raises(urllib.error.HTTPError) as raised:
            server.get(urllib.parse.quote(path))
        assert raised.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as raised:  # a route with the wrong method keeps its route
        server.get("/v1/completions")
    assert raised.value.code == 405
    series = [line for line in server.get("/metrics").splitlines() if line.startswith("metagen_requests_total{")]
    labels = {re.fullmatch(r'metagen_requests_total\{endpoint="([^"]*)",status="(\d+)"\} \d+', line).groups()
              for line in series}
    routes = {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
              "/metrics", "other"}
    assert {endpoint for endpoint, _ in labels} <= routes
    assert ("other", "404") in labels and ("/v1/completions", "405") in labels
    assert len(series) <= 3 * len(routes)  # a few statuses per route, not one series per path asked
    assert server.metric('metagen_requests_total{endpoint="other",status="404"}') >= 200


def test_a_deeply_nested_body_is_400_before_it_is_decoded(server, client, served_model):
    """[[[...]]] 100,000 deep made the recursive decoder raise RecursionError (500 and a traceback
    in the log); it is refused by its depth, measured without recursion, wherever it nests."""
    deep = "[" * 100_000 + "]" * 100_000
    for body in (deep, json.dumps({"prompt": "Hi"})[:-1] + ', "user": ' + deep + "}"):
        status, _, answer = _post(server, "/v1/completions", body.encode())
        assert status == 400, answer
        assert answer["error"]["code"] == "json_too_deep" and answer["error"]["param"] is None
        assert re.search(r"nests arrays and objects 10000[01] deep, more than the limit of 128$",
                         answer["error"]["message"])
    status, _, answer = _post(server, "/detokenize", b'{"tokens": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert status == 400 and answer["error"]["code"] == "json_too_deep"
    # a schema sent as JSON text is a string in the body: it is measured when it is read as a schema
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=served_model, prompt="Hi", max_tokens=2,
                                  extra_body={"structured_outputs": {"json": deep}})
    assert raised.value.param == "structured_outputs.json" and "limit of 128" in raised.value.message
    assert client.completions.create(model=served_model, prompt="Hi", max_tokens=2).choices  # still answering


@pytest.mark.parametrize("extra, param, message", [
    ({"temperature": -0.5}, "temperature", "out of range"),
    ({"top_p": 0}, "top_p", "out of range"),
    ({"topk": 3}, "topk", "unknown field"),
    ({"logprobs": 21}, "logprobs", "out of range"),
    ({"n": 99}, "n", "--max-rows"),
    ({"stop_token_ids": [10**7]}, "stop_token_ids", "out of range"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema", ""),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{not json"}}},
     "response_format.json_schema.schema", "is not valid JSON: Expecting"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs",
     "not both"),
    ({"structured_outputs": {"json": {"type": "nonsense"}}}, "structured_outputs.json", "does not compile"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "does not compile"),
    ({"structured_outputs": {"regex": "[^\\s\\S]"}}, "structured_outputs.regex", "cannot be satisfied"),
    ({"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs.grammar", "does not compile"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar", "does not compile"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "give at least one choice"),
])
def test_bad_fields_are_400_naming_the_field(client, served_model, extra, param, message):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=served_model, prompt="Hi", max_tokens=2, extra_body=extra)
    error = raised.value
    assert error.status_code == 400
    assert error.param == param and message in error.message
    assert error.body["type"] == "invalid_request_error"


def test_chat_errors_name_the_chat_field(client, served_model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served_model, messages=[{"role": "user", "content": "Hi"}],
                                       top_logprobs=30, logprobs=True)
    assert raised.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served_model, messages=[{"role": "robot", "content": "Hi"}])
    assert raised.value.param == "messages[0].role"
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.param == "model"


def test_prompt_beyond_the_context_and_oversized_bodies(server, client, served_model):
    limit = client.models.list().data[0].model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=served_model, prompt=[1] * limit, max_tokens=1)
    assert raised.value.param == "prompt" and f"context is {limit} tokens" in raised.value.message
    # a declared 2 MiB body is refused from its headers, before it is read
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                           b"\r\nContent-Length: %d\r\n\r\n{" % (2 << 20))
        answer = b""
        while b"}}" not in answer:  # the head and the JSON body may come in separate packets
            piece = connection.recv(65536)
            assert piece, f"connection closed after {answer!r}"
            answer += piece
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "more than the limit of 1048576" in answer
    status, _, body = _post(server, "/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    # still answering
    assert client.completions.create(model=served_model, prompt="Hi", max_tokens=2).choices[0].finish_reason


def test_tokenize_and_detokenize_round_trip(server, model):
    status, _, body = _post(server, "/tokenize", json.dumps({"prompt": "Hello world"}).encode())
    assert status == 200 and body["tokens"] == model.tokenizer.encode("Hello world") and body["count"] == len(body["tokens"])
    status, _, back = _post(server, "/detokenize", json.dumps({"tokens": body["tokens"]}).encode())
    assert status == 200 and back["prompt"] == model.tokenizer.decode(body["tokens"])
    status, _, error = _post(server, "/detokenize", json.dumps({"tokens": [-1]}).encode())
    assert status == 400 and error["error"]["param"] == "tokens"


QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def _strategy(server, metagen: dict, **fields) -> tuple[int, dict, dict]:
    body = {"messages": QUESTION, "max_tokens": 2, "temperature": 0.8, "seed": 1, "metagen": metagen, **fields}
    return _post(server, "/v1/chat/completions", json.dumps(body).encode())


@pytest.mark.parametrize(("metagen", "param", "words"), [
    # 125 000 request groups of --max-rows 8 were built before any check (n = 10**9: 62.5 M, +100 MB/s)
    ({"strategy": "self_consistency", "n": 10**6}, "metagen.n", "metagen.n=1000000 is out of range: must be <= 128"),
    ({"strategy": "mcts", "value": "steps", "n": 2, "expansions": 10**6}, "metagen.expansions",
     "metagen.expansions=1000000 is out of range: must be <= 128"),
    # a format spec padded each critique to the given width (20 000 000: 490 MB and 15 s per round)
    ({"strategy": "self_refine", "n": 2, "critique_template": "{answer:a>2000}"}, "metagen.critique_template",
     "format spec"),
])
def test_a_request_sized_past_the_limits_is_400_before_any_work(server, metagen, param, words):
    requests_before = server.metric("metagen_requests_finished_total")
    status, headers, body = _strategy(server, metagen)
    assert status == 400, body
    assert body["error"]["param"] == param and words in body["error"]["message"]
    assert server.metric("metagen_requests_finished_total") == requests_before  # nothing reached the engine
    assert '"ok"' in server.get("/health")


def test_max_n_and_a_strategy_call_that_can_never_be_queued():
    """--max-n bounds n and every option that sizes the work. A strategy call of n completions is
    ceil(n / --max-rows) engine requests, queued at once: more than --max-queue can never be queued,
    even on an idle server, so it is a 400 naming n and the limit (--max-rows x --max-queue), not
    a 429 whose Retry-After a client would follow forever."""
    with serve_process("--max-rows", "2", "--max-queue", "2", "--max-n", "16") as server:
        status, _, body = _strategy(server, {"strategy": "self_consistency", "n": 17})
        assert status == 400 and body["error"]["param"] == "metagen.n"
        assert "metagen.n=17 is out of range: must be <= 16 (--max-n" in body["error"]["message"]
        status, _, body = _post(server, "/v1/completions", json.dumps({"prompt": "Hi", "n": 17}).encode())
        assert status == 400 and body["error"]["param"] == "n" and "--max-n 16" in body["error"]["message"]
        for _ in range(2):  # the same answer every time: retrying cannot help
            status, headers, body = _strategy(server, {"strategy": "self_consistency", "n": 5})
            assert status == 400, body
            assert "retry-after" not in {name.lower() for name in headers}
            error = body["error"]
            assert error["param"] == "metagen.n" and error["type"] == "invalid_request_error"
            assert "n=5" in error["message"] and "at most 4 completions" in error["message"]
        status, _, body = _strategy(server, {"strategy": "self_consistency", "n": 4})  # fits: 2 requests of 2
        assert status == 200, body
        assert body["metagen"]["strategy"] == "self_consistency"


def _wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_full_queue_is_429_and_a_client_that_leaves_frees_its_rows():
    """One row, one queue place: a long stream runs, one request waits, the next is refused with
    429 and Retry-After; closing the stream frees the row and the waiting request completes."""
    with serve_process("--max-rows", "1", "--max-queue", "1", "--served-model-name", "smol") as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            model = client.models.list().data[0].id
            assert model == "smol"
            long = client.completions.create(model=model, prompt="Once", max_tokens=4000, temperature=1.0,
                                             extra_body={"ignore_eos": True}, stream=True)
            next(iter(long))  # the row is decoding
            waiting: list = []
            thread = threading.Thread(target=lambda: waiting.append(
                client.completions.create(model=model, prompt="Hi", max_tokens=3, temperature=0)))
            thread.start()
            _wait_for(lambda: server.metric("metagen_queue_depth") == 1)
            with pytest.raises(openai.RateLimitError) as raised:
                client.completions.create(model=model, prompt="Hi", max_tokens=3)
            assert raised.value.response.headers["retry-after"] == "1"
            assert raised.value.body["code"] == "queue_full"
            long.close()  # the client goes away mid-stream
            thread.join(timeout=60)
            assert waiting and waiting[0].choices[0].finish_reason == "length"
            _wait_for(lambda: server.metric("metagen_batch_rows") == 0)
            assert server.metric('metagen_requests_finished_total{outcome="cancelled"}') == 1
            assert server.metric("metagen_generation_tokens_total") < 4000  # the long row stopped early


@pytest.fixture(scope="module")
def keyed_lenient_server():
    """A server with an API key (s3cret), --lenient and --request-timeout 3."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("METAGEN_TEST_KEY", "s3cret")
        with serve_process("--api-key-env", "METAGEN_TEST_KEY", "--lenient", "--request-timeout", "3") as server:
            yield server


def test_lenient_lists_any_field_name_in_a_safe_header(keyed_lenient_server):
    """Ignored names went into X-Metagen-Ignored-Fields as they were: one outside latin-1 was a 500,
    CR / LF / NUL dropped the connection. Each name is percent-encoded (read back with unquote)
    and the header is bounded, the names past it counted."""
    server = keyed_lenient_server
    headers = {"Content-Type": "application/json", "Authorization": "Bearer s3cret"}
    for name in ("名前", "bad\r\nX-Injected: yes", "nul\x00", "a,b", "\ud800", "%41", "(2 more)"):
        body = json.dumps({"prompt": "Hi", "max_tokens": 1, name: 1}).encode()
        status, answer_headers, answer = _raw_post(server, "/v1/completions", body, headers)
        assert status == 200, answer
        assert "X-Injected" not in answer_headers
        value = answer_headers["X-Metagen-Ignored-Fields"]
        assert value.isascii() and value.isprintable() and "," not in value
        assert urllib.parse.unquote(value, errors="surrogatepass") == name
    names = [f"field_{index:03d}_{'x' * 12}" for index in range(300)]
    body = json.dumps({"prompt": "Hi", "max_tokens": 1, **dict.fromkeys(names, 1)}).encode()
    status, answer_headers, _ = _raw_post(server, "/v1/completions", body, headers)
    items = answer_headers["X-Metagen-Ignored-Fields"].split(",")
    assert status == 200 and len(",".join(items)) <= 1024
    more = re.fullmatch(r"\((\d+) more\)", items[-1])
    assert items[:-1] == names[: len(items) - 1] and int(more.group(1)) == len(names) - (len(items) - 1)
    # a strategy's answer lists them too (it had no header: the fields were ignored silently)
    body = json.dumps({"prompt": "Hi", "max_tokens": 1, "topk": 3,
                       "metagen": {"strategy": "self_consistency", "n": 2}}).encode()
    status, answer_headers, answer = _raw_post(server, "/v1/completions", body, headers)
    assert status == 200 and answer["metagen"]["strategy"] == "self_consistency"
    assert answer_headers["X-Metagen-Ignored-Fields"] == "topk"


def test_api_key_lenient_and_request_timeout(keyed_lenient_server):
    server = keyed_lenient_server
    assert '"ok"' in server.get("/health")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as raised:
            client.models.list()
        assert raised.value.body["code"] == "invalid_api_key"
    status, _, _ = _post(server, "/tokenize", b'{"prompt": "Hi"}')
    assert status == 401
    with openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0) as client:
        model = client.models.list().data[0].id
        answer = client.completions.with_raw_response.create(
            model=model, prompt="Hi", max_tokens=2, extra_body={"topk": 3, "best_effort": True})
        assert answer.headers["x-metagen-ignored-fields"] == "best_effort,topk"
        assert answer.parse().choices[0].text is not None
        with pytest.raises(openai.BadRequestError) as raised:  # lenient on names, not on values
            client.completions.create(model=model, prompt="Hi", max_tokens=2, temperature=-1)
        assert raised.value.param == "temperature"
        start = time.monotonic()
        with pytest.raises(openai.InternalServerError) as raised:  # longer than --request-timeout 3
            client.completions.create(model=model, prompt="Hi", max_tokens=5000, extra_body={"ignore_eos": True})
        assert raised.value.status_code == 504 and raised.value.body["code"] == "request_timeout"
        assert time.monotonic() - start < 30
        assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices  # still answering


def test_serve_refuses_bad_options_before_loading_the_model(monkeypatch, capsys):
    from metagen.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded"))
    monkeypatch.delenv("METAGEN_UNSET_KEY", raising=False)
    assert main(["serve", "--api-key-env", "METAGEN_UNSET_KEY"]) == 2
    assert "METAGEN_UNSET_KEY: that environment variable is unset or empty" in capsys.readouterr().err
    assert main(["serve", "--max-rows", "0"]) == 2
    assert "--max-rows 0 must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--request-timeout", "0"]) == 2
    assert "--request-timeout 0.0 must be > 0 seconds" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port 70000 must be in [0, 65535]" in capsys.readouterr().err
    assert main(["serve", "--max-n", "0"]) == 2
    assert "--max-n 0 must be >= 1" in capsys.readouterr().err
    # no place in the queue: every request would be refused with 429 and Retry-After, forever
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "--max-queue 0 must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--retriever", "bm25:/no/such/corpus.jsonl"]) == 2
    assert "--retriever='bm25:/no/such/corpus.jsonl': corpus '/no/such/corpus.jsonl' does not exist" in \
        capsys.readouterr().err
    assert main(["serve", "--retriever", "elastic:x"]) == 2
    assert "--retriever='elastic:x' must be one of bm25:PATH | dense:PATH | http" in capsys.readouterr().err


def test_a_non_streaming_client_that_leaves_frees_its_rows(server):
    cancelled = server.metric('metagen_requests_finished_total{outcome="cancelled"}')
    body = json.dumps({"prompt": "Once", "max_tokens": 4000, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
        _wait_for(lambda: server.metric("metagen_batch_rows") >= 1)
    _wait_for(lambda: server.metric('metagen_requests_finished_total{outcome="cancelled"}') == cancelled + 1)
    _wait_for(lambda: server.metric("metagen_batch_rows") == 0)
