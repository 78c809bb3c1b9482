"""The backend contract: what differs between `metagen serve` and `metagen serve --backend URL...`.

The HTTP handling (app.py and its routers) is written once over a `Backend`, held by the app's
`ServerState.backend`. Two classes implement it and say so by subclassing it: `LocalBackend`
(local.py: an `Engine` thread runs the model, strategies run over an `EngineGenerator`) and
`ProxyBackend` (proxy.py: remote OpenAI-compatible servers, strategies over a `ProxyGenerator`).
`tests/serve/test_backend_contract.py` checks that each defines every member with the
protocol's signature. A plain request's job (`submit`'s result) is a `BackendJob`: the engine's
`ServeRequest` or the proxy's `ProxyRequest` (dataclasses, whose fields meet it structurally;
the same test checks both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from metagen.serve.body import APIError
from metagen.serve.requests import ParsedRequest


@runtime_checkable
class BackendJob(Protocol):
    """One plain request started by `Backend.submit`: it emits TokenEvents, then one DoneEvent,
    through the `emit` it was given; read after the DoneEvent:

    completions: the completions (one per row, n of them).
    prompt_records: records of prompt tokens 1..T−1 when echo asked for them, else None.
    cached_tokens: prompt tokens taken from a prefix cache.
    """

    completions: list
    prompt_records: list | None
    cached_tokens: int

    def cancel(self) -> None:
        """Stop the request (the client left); it ends with its DoneEvent."""


@runtime_checkable
class Backend(Protocol):
    """What the app serves requests over.

    served_name: the model id clients send; max_rows: the most completions one request may ask
        for (n, a pooled strategy's n).
    model, texts: the `LanguageModel` and its `TokenTexts`, None in proxy mode (the backends
        encode prompts and render tokens themselves).
    """

    served_name: str
    max_rows: int
    model: object | None
    texts: object | None

    def check(self, parsed: ParsedRequest) -> None:
        """Refusals of this backend (APIError) of a parsed request, before it starts."""

    def submit(self, parsed: ParsedRequest, emit: Callable[[object], None], timeout: float | None) -> BackendJob:
        """Start a plain request; returns its job (see `BackendJob`). `timeout`: seconds from its
        arrival (None: no limit)."""

    def strategy_generator(self, chat: bool, timeout: float | None):
        """A `Generator` for one strategy run, with usage tallies (prompt_tokens,
        completion_tokens, requests) and cancel()."""

    def failure(self, error: BaseException, params=None) -> APIError | None:
        """The APIError answering an exception of `submit` or of a strategy (params: the
        request's, for the field a refusal is about); None when it is not this backend's to answer."""

    async def health(self) -> tuple[int, dict]:
        """(status code, body) of /health."""

    def model_cards(self) -> list[dict]:
        """The entries of /v1/models."""

    async def tokenize(self, body: dict) -> dict:
        """The answer of /tokenize."""

    async def detokenize(self, body: dict) -> dict:
        """The answer of /detokenize."""

    def metrics(self, counter) -> str:
        """The /metrics text, with the app's HTTP `counter`."""

    def close(self) -> None:
        """Stop serving (the engine thread, or the fleet's connections)."""
