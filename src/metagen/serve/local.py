"""The local model behind the app: `LocalBackend`, one of the two `Backend`s `create_app` serves.

A backend is what differs between `metagen serve` and `metagen serve --backend URL...`; its
contract is the `Backend` protocol (backend.py), over which the HTTP handling (app.py) is written
once. Here an `Engine` thread runs the model (engine.py), a plain request's job is its
`ServeRequest`, and strategies run over an `EngineGenerator`. The proxy backend (proxy.py)
forwards to remote servers instead.
"""

from __future__ import annotations

from collections.abc import Callable

from metagen.serve import metrics
from metagen.serve.backend import Backend
from metagen.serve.body import APIError, check_model, only
from metagen.serve.chat_request import parse_chat
from metagen.serve.requests import EngineStoppedError, ParsedRequest, QueueFullError, RequestTooLargeError, ServeRequest
from metagen.serve.responses import TokenTexts

RETRY_AFTER_SECONDS = 1


class LocalBackend(Backend):
    """`model` served by a started `engine` (see the module docstring)."""

    def __init__(self, model, engine, served_name: str | None = None) -> None:
        self.model, self.engine = model, engine
        self.served_name = served_name or model.name
        self.max_rows = engine.max_rows
        self.texts = TokenTexts(model.tokenizer)

    def check(self, parsed) -> None:
        """Nothing: the parse (`request_fields.parse_fields`) has checked the request against the model."""

    def submit(self, parsed: ParsedRequest, emit: Callable[[object], None], timeout: float | None) -> ServeRequest:
        job = ServeRequest(parsed.prompt_ids, parsed.params, emit, echo=parsed.echo_text is not None,
                           healed=parsed.healed, timeout=timeout)
        self.engine.submit(job)
        return job

    def strategy_generator(self, chat: bool, timeout: float | None):
        from metagen.serve.engine_generator import EngineGenerator

        return EngineGenerator(self.engine, self.model, chat=chat, timeout=timeout)

    def failure(self, error: BaseException, params=None) -> APIError | None:
        """429 with Retry-After for a full queue (the request fits once others leave); 400 naming
        metagen.n for a strategy call that no queue state could take (`RequestTooLargeError`);
        503 when the engine has stopped."""
        if isinstance(error, RequestTooLargeError):
            return APIError(str(error), "metagen.n")
        if isinstance(error, QueueFullError):
            return APIError(f"the server is busy: {error}; retry after {RETRY_AFTER_SECONDS} s", None, status=429,
                            type="rate_limit_error", code="queue_full",
                            headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        if isinstance(error, EngineStoppedError):
            return APIError(f"the server cannot generate: {error}", None, status=503, type="server_error",
                            code="engine_stopped")
        return None

    async def health(self) -> tuple[int, dict]:
        return (200, {"status": "ok", **self._decoding()}) if self.engine.alive else (503, {"status": "engine stopped"})

    def model_cards(self) -> list[dict]:
        return [{"id": self.served_name, "object": "model", "created": 0, "owned_by": "metagen",
                 "max_model_len": self.model.max_context, **self._decoding()}]

    def _decoding(self) -> dict:
        """{"decoding": its card} when the server decodes every request with a combiner
        (`metagen serve --contrastive / --dexperts`) or a drafter (`--speculative`), else nothing."""
        if self.engine.speculation is not None:
            from metagen.serve.speculation import speculation_card

            return {"decoding": speculation_card(self.engine.speculation)}
        if self.engine.combiner is None:
            return {}
        from metagen.serve.companions import combiner_card

        return {"decoding": combiner_card(self.engine.combiner)}

    async def tokenize(self, body: dict) -> dict:
        only(body, {"model", "prompt", "messages", "add_special_tokens"})
        check_model(body, self.served_name)
        if "messages" in body:
            ids = parse_chat({"messages": body["messages"]}, model=self.model,
                             served_name=self.served_name, max_rows=self.max_rows).prompt_ids
        else:
            prompt, special = body["prompt"], body.get("add_special_tokens", True)
            if not isinstance(prompt, str):
                raise APIError("prompt must be a string", "prompt")
            if not isinstance(special, bool):
                raise APIError("add_special_tokens must be true or false", "add_special_tokens")
            ids = self.model.tokenizer.encode(prompt, add_special_tokens=special)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.model.max_context}

    async def detokenize(self, body: dict) -> dict:
        only(body, {"model", "tokens"})
        check_model(body, self.served_name)
        tokens, vocab = body.get("tokens"), self.model.vocab_size
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
            raise APIError(f"tokens must be a list of token ids in [0, {vocab})", "tokens")
        return {"prompt": self.model.tokenizer.decode(tokens)}

    def metrics(self, counter) -> str:
        return metrics.render(self.engine, counter)

    def close(self) -> None:
        self.engine.stop()
