"""A `Generator` whose requests go through the serving engine, for strategies run by the server.

    generator = EngineGenerator(engine, model, chat=True)
    result = spec.run(generator, messages, n, params, options, rng)   # on a worker thread

Each `generate` / `continue_prefix` call encodes its prompt as `LocalGenerator` would, submits
one `ServeRequest` of `params.n` rows and blocks until the engine's `DoneEvent`; so a strategy's
samples join the running batch with every other client's rows (continuous batching), and the
engine thread never waits on a strategy. Call it from a worker thread, never the engine thread.
A call asking for more rows than the engine decodes at once (`n` > `--max-rows`) is submitted as
groups of at most `max_rows` rows at once (the prompt's prefill is shared through the prefix
cache when it is on); their completions are returned in group order. The groups wait in the
engine's queue together, so a call of more than `max_rows x max_queue` rows could never be
queued, even on an idle server: it raises `RequestTooLargeError` (HTTP 400) before any group is
built, where a call that fits but meets a full queue raises `QueueFullError` (429, retry later).

Seeding: the strategy's `torch.Generator` is handed to the engine with the request, which draws
from it for that request's rows exactly as `decoding.sample_loop.generate` does (the engine's
contract, see engine.py), so a strategy run here makes the same draws as on a `LocalGenerator`
with the same generator; the texts then agree up to the floating-point rounding of a batched
forward that other clients' rows share. Split calls draw from one generator per group, each
seeded by a draw from the call's generator (or from `params.seed`): reproducible, but not the
draws of a `LocalGenerator` decoding all n rows together.

`usage` tallies every request: prompt tokens (each request's prompt once: its n rows share its
prefill) and generated tokens over all rows; Cost is built per call as `LocalGenerator` builds it
(with a server-wide combiner, its companions' forwards too).
Capabilities: what the engine's rows carry (token ids, logprobs, top logprobs, certainties,
stop reasons, constraints) and step / assistant continuation; no LOCAL_CACHE (the model and its
cache belong to the engine thread) and no HIDDEN_STATES.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch

from metagen.decoding import capabilities as caps
from metagen.decoding.cost import Cost, forward_cost, prefill_cost
from metagen.decoding.generator import ModelGenerator
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.result import GenerationResult
from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, ServeRequest
from metagen.serve.requests import RequestTooLargeError

WAIT_POLL = 0.25  # seconds between checks that the strategy's client is still there


class StrategyCancelled(RuntimeError):
    """The client of the strategy went away: its remaining requests are not sent."""


class StrategyTimeout(RuntimeError):
    """One of the strategy's requests ran past the server's request timeout."""


class EngineGenerator(ModelGenerator):
    """Requests of one strategy run, through `engine` (see the module docstring).

    chat: the chat-template setting, as `LocalGenerator`'s; timeout: seconds each request may
    take (the server's --request-timeout); `cancel()` stops the run at its next request.
    """

    capabilities = frozenset({caps.TOKEN_PROMPTS, caps.TOKEN_IDS, caps.LOGPROBS, caps.TOP_LOGPROBS,
                              caps.FULL_DISTRIBUTIONS, caps.STEP_CONTINUATION, caps.ASSISTANT_CONTINUATION,
                              caps.STRUCTURED_OUTPUT})
    concurrent = True  # each call is its own engine request

    def __init__(self, engine: Engine, model, chat: bool | None = None, timeout: float | None = None) -> None:
        self.engine, self.model, self.chat, self.timeout = engine, model, chat, timeout
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._jobs: list[ServeRequest] = []  # in flight (dataclasses: kept in a list, not hashed)

    def cancel(self) -> None:
        """The client went away: cancel the requests in flight and refuse further ones."""
        self._cancelled.set()
        with self._lock:
            for job in self._jobs:
                job.cancel()

    def generate(self, prompt: Prompt, params: SamplingParams, *,
                 generator: torch.Generator | None = None) -> GenerationResult:
        ids = encode_prompt(self.tokenizer, prompt, self.chat, vocab_size=self.model.vocab_size)
        return self._run(ids, params, generator)

    def continue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        """The prefix's ids as given (text: its plain encoding, no chat template), like LocalGenerator."""
        return self._run(self.prefix_ids(prefix), params, generator)

    def _run(self, ids: list[int], params: SamplingParams, rng: torch.Generator | None) -> GenerationResult:
        if self._cancelled.is_set():
            raise StrategyCancelled("the client went away")
        if len(ids) >= self.model.max_context:
            raise ValueError(f"a prompt of the strategy has {len(ids)} tokens; this model's context is "
                             f"{self.model.max_context} tokens")
        start = time.perf_counter()
        jobs = [ServeRequest(ids, group_params, self._emitter(), timeout=self.timeout, generator=group_rng)
                for group_params, group_rng in self._groups(params, rng)]
        with self._lock:
            self._jobs.extend(jobs)
        try:
            for job in jobs:  # QueueFullError / EngineStoppedError / ValueError go to the caller
                self.engine.submit(job)
            for job in jobs:
                while not job.emit.finished.wait(WAIT_POLL):
                    if self._cancelled.is_set():
                        for other in jobs:
                            other.cancel()
        except BaseException:
            for job in jobs:  # those already submitted must not run on without their caller
                job.cancel()
            raise
        finally:
            with self._lock:
                for job in jobs:
                    self._jobs.remove(job)
        for job in jobs:
            event = job.emit.ended[0]
            if event.timed_out:
                raise StrategyTimeout(event.error)
            if event.error == "cancelled" and self._cancelled.is_set():
                raise StrategyCancelled("the client went away")
            if event.error is not None:
                raise RuntimeError(f"a request of the strategy failed: {event.error}")
        completions = [completion for job in jobs for completion in job.completions]
        generated = sum(len(c.token_ids) for c in completions)
        with self._lock:
            self.prompt_tokens += len(ids)
            self.completion_tokens += generated
            self.requests += 1
        companions = () if self.engine.companions is None else self.engine.companions.models
        cost = engine_cost(self.model, len(ids), [len(c.token_ids) for c in completions], companions)
        cost.generated_tokens, cost.wall_seconds = generated, time.perf_counter() - start
        return GenerationResult(completions, ids, cost)

    def _groups(self, params: SamplingParams, rng: torch.Generator | None) -> list[tuple[SamplingParams, object]]:
        """(params, generator) of each request of a call: one request of n rows, or groups of at
        most `engine.max_rows` rows, each with a generator seeded from the call's."""
        limit, places = self.engine.max_rows, self.engine.max_queue
        if -(-params.n // limit) > places:  # ceil(n / max_rows) requests, all queued at once
            raise RequestTooLargeError(
                f"a call of the strategy asks for n={params.n} completions: {-(-params.n // limit)} requests of at "
                f"most --max-rows {limit} rows, which --max-queue {places} can never hold at once; this server draws "
                f"at most {limit * places} completions per call: lower metagen.n")
        if params.n <= limit:
            return [(params, rng)]
        if rng is None and params.seed is not None:
            rng = params.make_generator()
        groups = []
        for first in range(0, params.n, limit):
            size = min(limit, params.n - first)
            group_rng = None
            if rng is not None:
                group_rng = torch.Generator()
                group_rng.manual_seed(int(torch.randint(0, 2**62, (1,), generator=rng)))
            groups.append((dataclasses.replace(params, n=size), group_rng))
        return groups

    @staticmethod
    def _emitter():
        """The `emit` callback of one request: records its `DoneEvent` (the engine thread's only
        message that matters here) and sets `emit.finished`."""
        finished, ended = threading.Event(), []

        def emit(event) -> None:
            if isinstance(event, DoneEvent):
                ended.append(event)
                finished.set()

        emit.finished, emit.ended = finished, ended
        return emit


def engine_cost(model, prompt_length: int, lengths: list[int], companions=()) -> Cost:
    """The forwards the engine ran for rows of `lengths` tokens after a prompt of `prompt_length`,
    counted as the sampling loop counts its own: the prefill forked into the rows
    (`cost.prefill_cost`), then decode step t = 1 .. longest − 1 (`cost.forward_cost`) feeding
    position prompt_length + t − 1 of every row longer than t (a row of L tokens is fed its
    first L − 1). `companions`: a server-wide combiner's models, run on the same rows (a call and
    its FLOPs each; the target steps are the model's, as `RowBatch` counts them).
    O(longest · rows · models)."""
    cost = prefill_cost(model, prompt_length, len(lengths))
    for companion in companions:
        cost += prefill_cost(companion, prompt_length, len(lengths), produced=False)
    for step in range(1, max(lengths, default=0)):
        starts = [prompt_length + step - 1] * sum(length > step for length in lengths)
        cost += forward_cost(model, starts)
        for companion in companions:
            cost += forward_cost(companion, starts, produced=False)
    return cost
