"""The search endpoint retriever against a real HTTP server (stdlib http.server on 127.0.0.1, a
free port, in a thread): answers parsed, a timed-out attempt retried by the remote floor's
transport, malformed answers refused naming the URL and the field."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("httpx")

from metagen.retrieval import HTTPRetriever, Passage, make_retriever, parse_retriever_spec  # noqa: E402
from metagen.remote.transport import ServerError  # noqa: E402

RESULTS = [{"id": 7, "text": "The Eiffel Tower was completed in 1889.", "score": 2.5, "title": "Eiffel Tower"},
           {"id": "b", "text": "Paris is the capital of France.", "score": 1.0}]


class SearchServer:
    """POST /search {"query", "k"} -> {"results": answer[:k]}; `delays` holds seconds to sleep
    before answering the next requests (one entry per request); honours_k False: the whole answer
whatever k; `requests` records the bodies."""

    def __init__(self) -> None:
        self.answer: object = {"results": RESULTS}
        self.delays: list[float] = []
        self.honours_k = True
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/search"

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if server.delays:
                    time.sleep(server.delays.pop(0))
                answer = server.answer
                if server.honours_k and isinstance(answer, dict) and isinstance(answer.get("results"), list):
                    answer = {"results": answer["results"][:body["k"]]}
                data = json.dumps(answer).encode()
                try:
                    self.send_response(200 if self.path == "/search" else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

        return Handler

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def server():
    running = SearchServer()
    running.start()
    yield running
    running.stop()


def test_results_are_read_from_the_endpoint(server):
    retriever = HTTPRetriever(server.url, timeout=5.0, max_retries=0)
    try:
        found = retriever.retrieve("when was the Eiffel Tower completed", k=2)
        assert found.passages == [Passage("7", RESULTS[0]["text"], 2.5, "Eiffel Tower"),
                                  Passage("b", RESULTS[1]["text"], 1.0, None)]
        assert server.requests == [{"query": "when was the Eiffel Tower completed", "k": 2}]
        assert found.cost.wall_seconds > 0 and found.cost.flops is None
        assert [p.id for p in retriever.search("x", k=1)] == ["7"]
    finally:
        retriever.close()


def test_a_timed_out_attempt_is_retried(server):
    server.delays = [1.5]  # the first answer comes after the attempt's timeout
    retriever = HTTPRetriever(server.url, timeout=0.4, max_retries=2, backoff=0.01, max_backoff=0.02)
    try:
        start = time.monotonic()
        assert [p.id for p in retriever.search("eiffel", k=2)] == ["7", "b"]
        assert len(server.requests) == 2 and time.monotonic() - start < 1.5
    finally:
        retriever.close()
    server.delays = [1.5]
    once = HTTPRetriever(server.url, timeout=0.4, max_retries=0)
    try:
        with pytest.raises(ServerError, match=r"/search.*no complete answer within 0.4 s"):
            once.search("eiffel", k=2)
    finally:
        once.close()


@pytest.mark.parametrize("answer, message", [
    ({"hits": []}, r"results: expected a list, got None"),
    ({"results": [{"id": "a", "score": 1.0}]}, r"results\[0\]\.text: expected a string, got None"),
    ({"results": [RESULTS[0], {"id": "a", "text": "t", "score": "high"}]},
     r"results\[1\]\.score: expected a finite number, got 'high'"),
    ({"results": [{"id": None, "text": "t", "score": 1}]}, r"results\[0\]\.id: expected a string or an int"),
    ({"results": [{"id": "a", "text": "t", "score": 1, "title": 5}]}, r"results\[0\]\.title: expected a string"),
    ({"results": ["text"]}, r"results\[0\]: expected an object, got 'text'"),
])
def test_a_malformed_answer_names_the_url_and_the_field(server, answer, message):
    server.answer = answer
    retriever = HTTPRetriever(server.url, timeout=5.0, max_retries=0)
    try:
        with pytest.raises(ServerError, match=r"127\.0\.0\.1:\d+/search.*malformed search answer: " + message):
            retriever.search("q", k=3)
    finally:
        retriever.close()


def test_more_results_than_k_are_refused(server):
    server.answer, server.honours_k = {"results": RESULTS * 3}, False
    retriever = HTTPRetriever(server.url, timeout=5.0, max_retries=0)
    try:
        with pytest.raises(ServerError, match=r"results: 6 passages for k=1"):
            retriever.search("q", k=1)
    finally:
        retriever.close()


def test_retriever_specs_are_checked_without_loading_anything(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n')
    assert parse_retriever_spec(f"bm25:{corpus}") == ("bm25", str(corpus), {})
    assert parse_retriever_spec(f"bm25:{corpus}?title_weight=3&k1=0.9&b=0") == (
        "bm25", str(corpus), {"title_weight": 3, "k1": 0.9, "b": 0.0})
    assert parse_retriever_spec(f"dense:{tmp_path}/c.jsonl") == ("dense", str(corpus), {})
    assert parse_retriever_spec("http://127.0.0.1:9/search") == ("http", "http://127.0.0.1:9/search", {})
    for bad, message in [("bm25", r"must be one of bm25:PATH \| dense:PATH \| http"),
                         (f"bm25:{corpus}?title=3", r"option 'title' is not a bm25 setting \(settings: k1, b, "
                                                    r"title_weight\)"),
                         (f"bm25:{corpus}?k1=0", r"k1='0' is out of range: must be a number > 0"),
                         (f"bm25:{corpus}?k1=nan", r"k1='nan' is out of range"),
                         (f"bm25:{corpus}?b=1.5", r"b='1.5' is out of range: must be a number in \[0, 1\]"),
                         (f"bm25:{corpus}?title_weight=2.5", r"title_weight='2.5' is not an int in \[0, 100\]"),
                         (f"bm25:{corpus}?b=0.5&b=0.4", r"give option 'b' once, as b=VALUE"),
                         (f"bm25:{corpus}?b", r"give option 'b' once, as b=VALUE"),
                         (f"dense:{corpus}?k1=1", r"option 'k1' is not a dense setting \(settings: none\)"),
                         ("sparse:x", r"must be one of"),
                         (f"bm25:{tmp_path}/missing.jsonl", r"missing.jsonl' does not exist"),
                         ("http://", r"must be http:// or https:// followed by host"),
                         ("http://h/search?q=1", r"without a query"), ("", "must be one of")]:
        with pytest.raises(ValueError, match=r"retriever=.*" + message):
            parse_retriever_spec(bad)
    with pytest.raises(ValueError, match="retriever="):
        make_retriever("ftp://h/x")
