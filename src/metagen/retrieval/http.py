"""A search endpoint over HTTP: the same retriever, the corpus behind a URL.

    POST <url>  {"query": "...", "k": 3}
    ->          {"results": [{"id": "...", "text": "...", "score": 1.5, "title": "..." | null}, ...]}

`id` may be a string or an int (kept as its string), `title` may be absent or null; results come
best first as the server orders them, at most k of them (more is an error: the server ignored k).
The request goes through the remote floor's `Transport` (remote/transport.py): its per-attempt
timeout, retries with exponential backoff on timeouts, connection errors, 429 and 5xx, and a
deadline for the whole call. A malformed answer is a `ServerError` naming the URL and the field
("results[2].score: expected a number, got 'high'"). Cost of a search: wall time; the server's
compute is unknown (flops None, as for any remote model).
"""

from __future__ import annotations

import math
import time
from urllib.parse import urlsplit

from metagen.decoding.cost import Cost
from metagen.retrieval.base import Passage, Retrieval, Retriever, check_k


def check_url(url: object) -> str:
    """`url` when it is http(s)://host[:port][/path], else ValueError naming it."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"url={url!r} must be http:// or https:// followed by host[:port][/path], "
                         "without a query or fragment")
    return url


class HTTPRetriever(Retriever):
    """Search at `url` (see the module); transport_options: `Transport` keyword arguments
    (timeout, max_retries, backoff, deadline, ...; api_key_env defaults to METAGEN_SEARCH_API_KEY,
    sent as a bearer token when set). Close it when done."""

    name = "http"

    def __init__(self, url: str, **transport_options) -> None:
        from metagen.remote.transport import Transport

        self.url = check_url(url).rstrip("/")
        base, _, path = self.url.rpartition("/")
        if "//" not in base or base.endswith("/"):  # no path: the host's root
            base, path = self.url, ""
        self.transport = Transport(base, **{"api_key_env": "METAGEN_SEARCH_API_KEY", **transport_options})
        self._path = path

    def close(self) -> None:
        self.transport.close()

    def retrieve(self, query: str, k: int) -> Retrieval:
        from metagen.remote.transport import ServerError

        check_k(k)
        start = time.perf_counter()
        answer = self.transport.post(self._path, {"query": query, "k": k})
        try:
            passages = parse_results(answer, k)
        except ValueError as error:
            raise ServerError(self.url, 200, f"malformed search answer: {error}") from None
        return Retrieval(passages, Cost(wall_seconds=time.perf_counter() - start, flops=None))


def parse_results(answer: dict, k: int) -> list[Passage]:
    """The passages of a search answer; ValueError naming the field that is missing or wrong."""
    results = answer.get("results")
    if not isinstance(results, list):
        raise ValueError(f"results: expected a list, got {_short(results)}")
    if len(results) > k:
        raise ValueError(f"results: {len(results)} passages for k={k}")
    passages = []
    for number, result in enumerate(results):
        where = f"results[{number}]"
        if not isinstance(result, dict):
            raise ValueError(f"{where}: expected an object, got {_short(result)}")
        identity, text, score, title = (result.get(name) for name in ("id", "text", "score", "title"))
        if isinstance(identity, bool) or not isinstance(identity, (str, int)):
            raise ValueError(f"{where}.id: expected a string or an int, got {_short(identity)}")
        if not isinstance(text, str):
            raise ValueError(f"{where}.text: expected a string, got {_short(text)}")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"{where}.score: expected a finite number, got {_short(score)}")
        if title is not None and not isinstance(title, str):
            raise ValueError(f"{where}.title: expected a string or null, got {_short(title)}")
        passages.append(Passage(str(identity), text, float(score), title))
    return passages


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
