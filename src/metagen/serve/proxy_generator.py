"""`ProxyGenerator`: one strategy run's view of the proxy's remote fleet (proxy mode's `EngineGenerator`).

    generator = ProxyGenerator(backend, chat=True)
    result = spec.run(generator, messages, n, params, options, rng)   # on a worker thread

Every call is the fleet's own (`FleetGenerator._generate` / `_continue_prefix`: the engine's
field table, fan-out, failover), run on the fleet's event loop; this view adds what one run
needs: the request's chat setting (a text prompt of a chat request is a user message), the
tallies `usage` reads (prompt tokens and generated tokens as the backends reported them, requests
sent), and `cancel()` (a client that went away: the request in flight is cancelled, no further
one is sent). Capabilities are the fleet's, probed from the servers: a strategy needing what
they lack (tokenwise CD: local_cache; self-certainty: full_distributions) is refused by name
before any request.

Usage here is the servers' own count: each request's prompt tokens (computed + served from the
server's prefix cache) and generated tokens, so `usage.prompt_tokens` equals the Cost's
`prompt_tokens_computed + prompt_tokens_reused` and `completion_tokens` its `generated_tokens`.
"""

from __future__ import annotations

import threading

import torch

from metagen.decoding.generator import Generator
from metagen.decoding.prompts import Prompt
from metagen.decoding.result import GenerationResult
from metagen.sampling import SamplingParams
from metagen.serve.engine_generator import StrategyCancelled

WAIT_POLL = 0.25  # seconds between checks that the strategy's client is still there


class ProxyGenerator(Generator):
    """Requests of one strategy run over `backend.remote` (see the module docstring)."""

    concurrent = True

    def __init__(self, backend, chat: bool) -> None:
        self.backend, self.remote, self.chat = backend, backend.remote, chat
        self.tokenizer = self.remote.tokenizer  # step searches render chat prompts with it (None: refused)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        profile = self.remote.profile
        self.described_as = f"the backend fleet ({profile.engine.name} at {[e.url for e in self.remote.endpoints]})"

    @property
    def capabilities(self) -> frozenset[str]:
        return self.remote.capabilities

    def cancel(self) -> None:
        self._cancelled.set()

    def decode(self, token_ids: list[int]) -> str:
        return self.remote.decode(token_ids)

    def served_identity(self) -> dict:
        return self.remote.served_identity()

    @property
    def max_context(self) -> int | None:
        return self.remote.profile.max_model_len

    def generate(self, prompt: Prompt, params: SamplingParams, *,
                 generator: torch.Generator | None = None) -> GenerationResult:
        if self.chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        return self._run(self.remote._generate(prompt, params, generator))

    def continue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        return self._run(self.remote._continue_prefix(prefix, params, generator))

    def _run(self, coroutine) -> GenerationResult:
        """Run one call on the fleet's loop, cancelling it if the client goes away; tally its Cost."""
        if self._cancelled.is_set():
            coroutine.close()
            raise StrategyCancelled("the client went away")
        future = self.remote.loop.submit(coroutine)
        while True:
            try:
                result = future.result(timeout=WAIT_POLL)
                break
            except TimeoutError:
                if self._cancelled.is_set():
                    future.cancel()
                    raise StrategyCancelled("the client went away") from None
        cost = result.cost
        with self._lock:
            self.prompt_tokens += cost.prompt_tokens_computed + cost.prompt_tokens_reused
            self.completion_tokens += cost.generated_tokens
            self.requests += cost.model_calls
        self.backend.add_usage(cost)
        return result
