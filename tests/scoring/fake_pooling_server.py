"""A fake vLLM pooling server for a process reward model (stdlib http.server on 127.0.0.1, a free
port, in a thread; stopped on exit), answering with a real tiny transformers model.

It reproduces vLLM's `/pooling` endpoint (vllm/entrypoints/pooling/pooling/protocol.py,
PoolingCompletionRequest / PoolingChatRequest -> PoolingResponse, vLLM 0.9 – 0.11 and later)
for a model served with the STEP pooler (Qwen2ForProcessRewardModel's default, or
`--pooler-config` with step_tag_id / returned_token_ids for Math-Shepherd):
- request `{"model"?, "messages": [...]}`: the chat template rendered (add_generation_prompt
  false), tokenized without special tokens; `{"model"?, "input": str | [str, ...]}`: each text
  tokenized with the tokenizer's special tokens (add_special_tokens defaults to true);
- per input: the model's token-level logits (T, V), the `returned_token_ids` columns when set,
  a softmax, and only the rows at positions holding `step_tag_id`;
- answer `{"id", "object": "list", "created", "model", "data": [{"index", "object": "pooling",
  "data": [[p_0, p_1], ...]}], "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0}}`;
- GET /v1/models lists the model (the transport's health check); an unknown "model" is a 404
  with vLLM's error body.
Left out: `task`, `encoding_format` (base64 / bytes), `truncate_prompt_tokens`, `dimensions`,
`use_activation`, token-id inputs, chunked processing, the IO-processor plugins; `/classify` and
`/score`. `edit(payload)` returns the payload to send instead (a broken server); `requests`
records every POST body.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class FakePoolingServer:
    def __init__(self, model, tokenizer, step_tag_id: int, returned_token_ids: list[int] | None = None,
                 name: str = "tiny-prm") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.step_tag_id, self.returned_token_ids = step_tag_id, returned_token_ids
        self.edit = None
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakePoolingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def rows(self, ids: list[int]) -> list[list[float]]:
        """vLLM's STEP pooling of one input: softmax rows at the step tag's positions."""
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].float()  # (T, V) or (T, 2)
        if self.returned_token_ids:
            logits = logits[:, self.returned_token_ids]
        keep = [t for t, token in enumerate(ids) if token == self.step_tag_id]
        return logits.softmax(-1)[keep].tolist()

    def pool(self, body: dict) -> tuple[int, dict]:
        if body.get("model") not in (None, self.name):
            return 404, {"error": {"message": f"The model `{body['model']}` does not exist.", "type": "NotFoundError",
                                   "param": "model", "code": 404}}
        if "messages" in body:
            text = self.tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=False)
            inputs = [self.tokenizer.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False)))]
        else:
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            inputs = [self.tokenizer.encode(t, add_special_tokens=body.get("add_special_tokens", True)) for t in texts]
        tokens = sum(len(ids) for ids in inputs)
        return 200, {"id": "pool-fake", "object": "list", "created": int(time.time()), "model": self.name,
                     "data": [{"index": i, "object": "pooling", "data": self.rows(ids)} for i, ids in enumerate(inputs)],
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._reply(200, {"object": "list", "data": [{"id": server.name, "object": "model",
                                                                  "owned_by": "vllm"}]})
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append(body)
                if self.path != "/pooling":
                    self._reply(404, {"detail": "Not Found"})
                    return
                status, payload = server.pool(body)
                if status == 200 and server.edit is not None:
                    payload = server.edit(payload)
                self._reply(status, payload)

        return Handler
