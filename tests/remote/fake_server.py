"""A scripted OpenAI-compatible server (stdlib http.server in a thread on 127.0.0.1).

Answers are shaped as the engines' documented schemas (see metagen.remote.engines for the
sources):
- "vllm": `owned_by="vllm"`, `max_model_len` in /v1/models; honours n; with
  `return_tokens_as_token_ids` every token in logprobs (sampled and top) is "token_id:<id>",
  the top dict holding the sampled token besides the top k; choices carry `stop_reason`;
  `usage.prompt_tokens_details.cached_tokens`.
- "sglang": `owned_by="sglang"`; honours n; token texts only; choices carry `matched_stop`.
- "llama.cpp": `owned_by="me"`; answers n with one choice; a token-id prompt is a 500
  (pydantic validation error through llama-cpp-python's error handler).
- "openai": `owned_by="system"`; otherwise answered as vLLM without its extras: OpenAI's API
  honours n, returns logprobs keyed by token text and never token ids, and its usage carries
  `prompt_tokens_details.cached_tokens` (0 here).
`owned_by` replaces the engine's owner in /v1/models: a server metagen does not recognise there
(Ollama lists its models as owned by "library") answering in the engine's shape.
A request carrying a constraint field (vLLM `structured_outputs`, `response_format`, SGLang
`json_schema` / `regex` / `ebnf`, llama.cpp `grammar`) is answered with `constrained_text` when
that is set, ending with finish_reason "stop" as an engine does where its grammar accepts (or
"length" when `constrained_finish` says so; `constrained_stop` is reported as the stop string
that cut it).
Faults are scripted with `fail(status, body, headers)`: the next generation requests get them.
Broken answers: `usage_edit(usage)` returns the usage to send instead (a server reporting
negative or non-numeric counts); `stream_edit(chunks)` returns the chunks a stream sends
instead of the well-formed ones (a stream cut before its finish_reason, with fewer choices
than asked, or naming a choice index the request never asked for).
`delay` holds every generation answer that many seconds; `peak` is the most generation requests
the server had in flight at once (how far a client's requests really overlapped).
Faults of real servers, each named where it is set:
- `hang = True`: every request (GETs too) is read and never answered, the connection left open
  (a wedged process: it accepts connections, its event loop never runs the handler).
- `drip = s`: generation answers are sent one byte every s seconds (a server behind a slow link,
  or one sending SSE keep-alive comments forever: every read gets something, none gets all).
- `reject(predicate, status, body)`: requests whose body matches get that status, every time
  (a request the engine cannot run, e.g. llama.cpp's 500 for a grammar it fails to build from a
  3,000-string `choice`), the others are answered.
- `models_delay = s`: GET /v1/models answered s seconds late, generation at once
  (llama-cpp-python's server generating on a loaded machine answered /v1/models in over 5 s).
- `slots = k`: GET /props answers `{"total_slots": k}` as llama.cpp's server does; else 404 (as
  llama-cpp-python, vLLM and SGLang answer).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
CONSTRAINT_FIELDS = ("structured_outputs", "response_format", "json_schema", "regex", "ebnf", "grammar")


class FakeServer:
    def __init__(self, engine: str = "vllm", model: str = "fake-model", logprobs: bool = True,
                 cached_tokens: int = 0, owned_by: str | None = None) -> None:
        self.engine, self.model, self.logprobs, self.cached_tokens = engine, model, logprobs, cached_tokens
        self.owned_by = owned_by
        self.requests: list[tuple[str, dict, dict]] = []  # (path, body, headers)
        self.faults: list[tuple[int, bytes, dict, float]] = []
        self.choices_override: int | None = None
        self.delay = 0.0
        self.usage_edit = None  # usage dict -> the usage dict to send
        self.stream_edit = None  # list of stream chunks -> the chunks to send
        self.constrained_text: str | None = None
        self.constrained_finish = "stop"
        self.constrained_stop: str | None = None  # the stop string reported as having cut it
        self.in_flight = self.peak = 0
        self.hang = False
        self.drip = 0.0
        self.rejects: list[tuple[object, int, bytes]] = []
        self.slots: int | None = None
        self.models_delay = 0.0
        self._released = threading.Event()  # set on exit: hanging handlers return
        self._count_lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def fail(self, status: int, body: bytes | str = b"", headers: dict | None = None, delay: float = 0.0) -> None:
        """The next generation request gets this answer, after `delay` seconds (status 0: the
        normal answer, late)."""
        self.faults.append((status, body.encode() if isinstance(body, str) else body, headers or {}, delay))

    def reject(self, predicate, status: int = 500, body: str = '{"error": {"message": "cannot run this"}}') -> None:
        """Every generation request whose body satisfies `predicate` gets `status` (see the docstring)."""
        self.rejects.append((predicate, status, body.encode()))

    def posts(self) -> list[dict]:
        return [body for path, body, _ in self.requests if path not in ("/v1/models", "/props")]

    # answers -------------------------------------------------------------------------------

    def models(self) -> dict:
        owners = {"vllm": "vllm", "sglang": "sglang", "llama.cpp": "me", "openai": "system"}
        owner = self.owned_by or owners[self.engine]
        entry = {"id": self.model, "object": "model", "owned_by": owner}
        if self.engine == "vllm":
            entry["max_model_len"] = 2048
        return {"object": "list", "data": [entry]}

    def choice(self, body: dict, index: int, chat: bool) -> dict:
        seed = body.get("seed") or 0
        length = min(int(body.get("max_tokens", 16)), 4)
        ids = [100 + (seed + 7 * index + t) % 50 for t in range(length)]
        pieces = [" " + WORDS[i % len(WORDS)] for i in ids]
        stop_hit = next((s for s in body.get("stop") or [] if s in "".join(pieces)), None)
        if stop_hit is not None:
            cut = "".join(pieces).index(stop_hit)
            kept = [p for k, p in enumerate(pieces) if len("".join(pieces[:k + 1])) <= cut]
            pieces, ids = kept, ids[:len(kept)]
        text = "".join(pieces)
        constrained = self.constrained_text is not None and any(name in body for name in CONSTRAINT_FIELDS)
        if constrained:
            text, stop_hit = self.constrained_text, self.constrained_stop
        as_ids = self.engine == "vllm" and body.get("return_tokens_as_token_ids")
        name = (lambda i, p: f"token_id:{i}") if as_ids else (lambda i, p: p)
        finish = self.constrained_finish if constrained else ("stop" if stop_hit else "length")
        choice: dict = {"index": index, "finish_reason": finish}
        if self.engine == "vllm":
            choice["stop_reason"] = stop_hit
        if self.engine == "sglang":
            choice["matched_stop"] = stop_hit
        k = body.get("top_logprobs", 0) if chat else body.get("logprobs")
        wants = body.get("logprobs") is not None and body.get("logprobs") is not False  # 0: sampled token only
        logprobs = None
        if wants and self.logprobs:
            values = [-0.5 - 0.1 * t for t in range(len(ids))]
            alternatives = [{name(i + 1 + j, f" alt{j}"): v - 1.0 - j for j in range(k or 0)} | {name(i, p): v}
                            for i, p, v in zip(ids, pieces, values)]
            if chat:
                logprobs = {"content": [
                    {"token": name(i, p), "logprob": v, "bytes": None,
                     "top_logprobs": [{"token": t, "logprob": lv} for t, lv in alt.items()]}
                    for i, p, v, alt in zip(ids, pieces, values, alternatives)]}
            else:
                logprobs = {"tokens": [name(i, p) for i, p in zip(ids, pieces)], "token_logprobs": values,
                            "top_logprobs": alternatives, "text_offset": list(range(len(ids)))}
                if body.get("echo"):
                    logprobs["tokens"] = ["Hello", " world"] + logprobs["tokens"]
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = (body["prompt"] if body.get("echo") else "") + text
        choice["logprobs"] = logprobs
        return choice, len(ids)

    def complete(self, path: str, body: dict) -> tuple[int, dict]:
        chat = path.endswith("chat/completions")
        if not chat and isinstance(body.get("prompt"), list) and self.engine == "llama.cpp":
            return 500, {"error": {"message": "Input should be a valid string ('body', 'prompt', 'str')"}}
        n = int(body.get("n", 1))
        count = 1 if self.engine == "llama.cpp" else n
        if self.choices_override is not None:
            count = self.choices_override
        made = [self.choice(body, index, chat) for index in range(count)]
        prompt_tokens = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 5
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": sum(m[1] for m in made),
                 "total_tokens": prompt_tokens + sum(m[1] for m in made)}
        if self.engine in ("vllm", "openai"):
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        if self.usage_edit is not None:
            usage = self.usage_edit(usage)
        kind = "chat.completion" if chat else "text_completion"
        return 200, {"id": "x", "object": kind, "model": body.get("model"), "choices": [m[0] for m in made],
                     "usage": usage}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, payload: bytes, headers: dict | None = None) -> None:
                self._leave()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    if fake.drip and status == 200 and self.command == "POST":
                        for k in range(len(payload)):
                            self.wfile.write(payload[k:k + 1])
                            self.wfile.flush()
                            if fake._released.wait(fake.drip):
                                return
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the timeout tests): nothing to report

            def do_GET(self) -> None:
                fake.requests.append((self.path, {}, dict(self.headers)))
                if fake.hang:
                    fake._released.wait()
                    return
                if self.path == "/v1/models" and fake.models_delay:
                    fake._released.wait(fake.models_delay)
                if self.path == "/props":
                    if fake.slots is None:
                        return self._reply(404, b'{"error": {"message": "File Not Found"}}')
                    return self._reply(200, json.dumps({"total_slots": fake.slots}).encode())
                self._reply(200, json.dumps(fake.models()).encode())

            counted = False  # whether this request is in `in_flight`

            def do_POST(self) -> None:
                with fake._count_lock:
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                self.counted = True
                try:
                    self._answer()
                finally:
                    self._leave()

            def _leave(self) -> None:
                """Counts the request out before its answer is sent: a client that has read the
                answer may send its next request before this handler's thread runs on."""
                if self.counted:
                    self.counted = False
                    with fake._count_lock:
                        fake.in_flight -= 1

            def _answer(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body, dict(self.headers)))
                if fake.hang:
                    fake._released.wait()
                    return
                time.sleep(fake.delay)
                for predicate, status, payload in fake.rejects:
                    if predicate(body):
                        return self._reply(status, payload)
                if fake.faults:
                    status, payload, headers, delay = fake.faults.pop(0)
                    time.sleep(delay)
                    if status:
                        return self._reply(status, payload, headers)
                status, answer = fake.complete(self.path, body)
                if body.get("stream") and status == 200:
                    return self._stream(answer, body)
                self._reply(status, json.dumps(answer).encode())

            def _stream(self, answer: dict, body: dict) -> None:
                """The answer as Server-Sent Events: one chunk per word of each choice, its finish
                reason, the usage when asked (stream_options.include_usage), then [DONE]."""
                self._leave()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chat = answer["object"] == "chat.completion"
                while fake.drip and not fake._released.wait(fake.drip):
                    try:  # SSE comments keep the connection busy; no chunk ever comes
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        return

                chunks = []

                def send(choices: list, **extra) -> None:
                    chunks.append({"id": "x", "object": answer["object"] + ".chunk", "choices": choices, **extra})

                for choice in answer["choices"]:
                    text = choice["message"]["content"] if chat else choice["text"]
                    for word in re.findall(r"\s*\S+", text):
                        send([{"index": choice["index"], "finish_reason": None,
                               **({"delta": {"content": word}} if chat else {"text": word})}])
                    last = {"index": choice["index"], "finish_reason": choice["finish_reason"]}
                    for key in ("stop_reason", "matched_stop"):
                        if key in choice:
                            last[key] = choice[key]
                    send([last | ({"delta": {}} if chat else {"text": ""})])
                if (body.get("stream_options") or {}).get("include_usage"):
                    send([], usage=answer["usage"])
                if fake.stream_edit is not None:
                    chunks = fake.stream_edit(chunks)
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler
