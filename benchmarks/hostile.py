"""Hostile traffic for a soak of `metagen serve` (benchmarks/serve.py --soak S --hostile K): requests
a careless or malicious client sends to an unauthenticated server, each of which once froze the
server or grew its memory. A hostile client sends them in turn, each on a fresh connection with
its own deadline, and records the status it got (or "timeout" / the error), so the soak reports
what the hostile requests were answered beside the valid clients' latency.

Every request is built here from the served model's name; none of them needs an answer to be
useful, and a correct server answers each within seconds: most with a 4xx naming the field, the
rest (a backtracking-prone answer pattern, a huge exponent for math comparison, a long prompt, an
echo of a long prompt with log-probabilities, a client that leaves mid-stream) with a bounded
amount of work.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from urllib.parse import urlparse

RANDOM_PATH = "/v1/<random>"  # a new path each time it is sent (metrics series must not grow with paths)
LONG_WORDS = ("the history of printing began with movable type in east asia and later in europe where "
              "presses spread quickly through the cities ")


def _chat(model: str, content: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def catalogue(model: str) -> list[tuple[str, str, bytes, dict]]:
    """(name, path, body, headers) of every hostile request."""
    json_headers = {"Content-Type": "application/json"}

    def post(name: str, body: dict, path: str = "/v1/chat/completions") -> tuple[str, str, bytes, dict]:
        return name, path, json.dumps(body).encode(), json_headers

    forced_as = {"structured_outputs": {"regex": "a{48}!"}, "max_tokens": 64, "temperature": 1.0}
    huge_power = {"structured_outputs": {"choice": ["\\boxed{9^{9^{8}}}", "\\boxed{3}"]}, "max_tokens": 16,
                  "temperature": 1.0}
    nested = ("[" * 100_000 + "]" * 100_000).encode()
    return [
        post("backtracking pattern", _chat(model, "Say a.", **forced_as,
                                           metagen={"strategy": "self_consistency", "n": 2, "pattern": "(a+)+$"})),
        post("huge exponent vote", _chat(model, "Pick one.", **huge_power,
                                         metagen={"strategy": "self_consistency", "n": 4, "math": True})),
        post("n = 10**9", _chat(model, "Hi", metagen={"strategy": "self_consistency", "n": 10**9})),
        post("template format spec", _chat(model, "Hi", metagen={"strategy": "self_refine", "n": 1,
                                                                 "critique_template": "{answer:a>20000000}"})),
        post("plain n past the queue", _chat(model, "Hi", n=100_000, max_tokens=1)),
        post("3,000 choices", _chat(model, "Pick", max_tokens=4,
                                    structured_outputs={"choice": [f"option {i}" for i in range(3000)]})),
        post("grammar a{100000}", _chat(model, "Say a", max_tokens=4,
                                         structured_outputs={"grammar": 'start: "a"{100000}'})),
        ("text/plain body", "/v1/chat/completions", json.dumps(_chat(model, "Hi", max_tokens=1)).encode(),
         {"Content-Type": "text/plain"}),
        ("form body", "/v1/completions", b"prompt=Hi&max_tokens=1", {"Content-Type": "application/x-www-form-urlencoded"}),
        ("deeply nested body", "/v1/chat/completions", nested, json_headers),
        ("oversized body", "/v1/completions", b'{"prompt": "' + b"x" * (2 << 20) + b'"}', json_headers),
        ("random path", RANDOM_PATH, b"{}", json_headers),
        post("long prompt", {"model": model, "prompt": LONG_WORDS * 180, "max_tokens": 1}, "/v1/completions"),
        post("echo of a long prompt", {"model": model, "prompt": LONG_WORDS * 150, "max_tokens": 1, "echo": True,
                                       "logprobs": 5}, "/v1/completions"),
        post("left mid-stream", _chat(model, "Tell a long story.", max_tokens=200, stream=True, ignore_eos=True)),
    ]


def send(url: str, name: str, path: str, body: bytes, headers: dict, deadline: float) -> str:
    """One request on its own connection; the status, "timeout" or the error's name. A stream is
    read for one chunk and then dropped (a client that leaves)."""
    parts = urlparse(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=deadline)
    try:
        if path == RANDOM_PATH:
            path = "/v1/%08x" % random.getrandbits(32)
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        if name == "left mid-stream":
            answer.read1(64)
            return str(answer.status)
        answer.read()
        return str(answer.status)
    except TimeoutError:
        return "timeout"
    except OSError as error:
        return type(error).__name__
    finally:
        connection.close()


def hostile_client(url: str, model: str, index: int, stop_at: float, deadline: float = 120.0) -> list[dict]:
    """Hostile requests in turn (starting at `index` in the catalogue) until `stop_at`
    (time.perf_counter()); one record per request: name, status, seconds."""
    records, requests = [], catalogue(model)
    number = index
    while time.perf_counter() < stop_at:
        name, path, body, headers = requests[number % len(requests)]
        start = time.perf_counter()
        status = send(url, name, path, body, headers, deadline)
        records.append({"name": name, "status": status, "seconds": time.perf_counter() - start})
        number += 1
    return records


def summary(records: list[dict]) -> dict[str, dict]:
    """name -> {"statuses": {status: count}, "max_seconds": ...} over a soak's hostile records."""
    found: dict[str, dict] = {}
    for record in records:
        entry = found.setdefault(record["name"], {"statuses": {}, "max_seconds": 0.0})
        entry["statuses"][record["status"]] = entry["statuses"].get(record["status"], 0) + 1
        entry["max_seconds"] = max(entry["max_seconds"], record["seconds"])
    return found
